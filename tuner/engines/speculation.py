"""Speculative decoding methods, named once for every engine; each adapter says how it runs them.

The engine-neutral methods (``METHODS``), and what each speculates with:

* ``draft_model``: a separate small model that shares the target's vocabulary (a *draft*);
* ``eagle``: a trained EAGLE head, one decoder layer over the target's last hidden state;
* ``eagle3``: a trained EAGLE-3 head, over three of the target's hidden states, with its own
  smaller draft vocabulary;
* ``mtp``: the target's own multi-token-prediction layers: only for a target that ships them;
* ``ngram``: n-gram lookup in the prompt, no model;
* ``suffix``: suffix decoding over the prompt and earlier answers, no model.

``OFF`` is no speculation. A draft or head folder has a *kind*, the method it serves
(``WITH_DRAFT``); ``tuner.engines.drafts`` tells it from the folder's files.

A config's speculation is in its params: ``spec_method``, ``num_speculative_tokens`` (K, the tokens
proposed per step), ``draft_model`` (the draft or head, for a method in ``WITH_DRAFT``) and the
engine-specific parameters an adapter's ``SpecSupport.params`` lists for the method:
``ngram_lookup`` ([min, max] tokens matched, vLLM), ``spec_schedule`` (K by batch size, vLLM) and
``spec_tree`` ([top-k, draft tokens] of the EAGLE tree, SGLang). Speculation is on exactly when
K > 0 and the method is not ``OFF``.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

from tuner.engines.versions import matches

OFF = "off"
DRAFT_MODEL = "draft_model"  # what a config recorded before methods were a parameter speculated with
METHODS = (DRAFT_MODEL, "eagle", "eagle3", "mtp", "ngram", "suffix")
WITH_DRAFT = (DRAFT_MODEL, "eagle", "eagle3")  # methods that speculate with a folder of their own
WITH_TARGET_LAYERS = ("mtp",)  # methods that speculate with layers the target itself ships
LABELS = {
    OFF: "off", "draft_model": "draft model", "eagle": "EAGLE", "eagle3": "EAGLE-3", "mtp": "MTP",
    "ngram": "n-gram", "suffix": "suffix decoding",
}  # fmt: skip
ENGINE_PARAMS = ("ngram_lookup", "spec_schedule", "spec_tree")  # a method's parameters some engine takes


@dataclass(frozen=True)
class SpecSupport:
    """How one engine runs one method: its own name for it (vLLM's ``method``, SGLang's
    ``--speculative-algorithm``), the engine-specific parameters it takes, a package its
    environment must hold (imported as ``module``), the supported versions that have it (None:
    all), and the scheduling slots per request its drafting takes (None: the engine does not say)."""

    name: str
    params: tuple[str, ...] = ()
    module: str | None = None
    install: str = ""
    versions: tuple[str, ...] | None = None
    draft_slots: int | None = None


def method_of(params: Mapping[str, Any]) -> str:
    """The method a config's params speculate with (``OFF``: none). A config recorded before the
    method was a parameter named a model-free method as its draft, or else a draft model."""
    if int(params.get("num_speculative_tokens") or 0) <= 0:
        return OFF
    method = params.get("spec_method")
    if method:
        return str(method)
    draft = str(params.get("draft_model") or "")
    return draft if draft in METHODS else DRAFT_MODEL


def draft_of(params: Mapping[str, Any]) -> str | None:
    """The draft or head a config speculates with (None: its method takes none, or it is off)."""
    return str(params["draft_model"]) if method_of(params) in WITH_DRAFT and params.get("draft_model") else None


def proposer_of(params: Mapping[str, Any]) -> str | None:
    """What proposes a config's speculative tokens, as one name: its draft or head, or else its
    model-free method (``ngram``, ``suffix``, ``mtp``), which has no draft to name; None when off.
    Drafting costs and acceptance are facts of the proposer (``tuner.search.model``)."""
    method = method_of(params)
    return None if method == OFF else draft_of(params) or method


def describe(params: Mapping[str, Any]) -> str:
    """A config's speculation in words: ``EAGLE-3 eagle3-head K=3``, ``n-gram K=4`` or ``off``."""
    method = method_of(params)
    if method == OFF:
        return LABELS[OFF]
    draft = draft_of(params)
    return " ".join(p for p in (LABELS.get(method, method), draft, f"K={int(params['num_speculative_tokens'])}") if p)


def unavailable(
    engine: str, supports: Mapping[str, SpecSupport], method: str, version: str, modules: Container[str] | None
) -> str | None:
    """Why ``engine`` at ``version`` cannot run ``method`` here, in a few words (None: it can).
    ``modules``: the packages its environment holds (None: not known, so assumed there)."""
    support = supports.get(method)
    if support is None:
        return f"{engine} has no {LABELS.get(method, method)}"
    if support.versions is not None and not matches(version, support.versions):
        return f"{engine} {version} has no {LABELS.get(method, method)} (it has from {', '.join(support.versions)})"
    if support.module is not None and modules is not None and support.module not in modules:
        return f"its environment lacks {support.module} ({support.install})"
    return None
