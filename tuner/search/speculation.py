"""What each engine of a study may speculate with: the methods its space lists, less those the engine,
its version, its environment or the model cannot run (each left out with one line saying why),
every method with the drafts and heads that serve it and the engine's own parameters for it.

The sampler then only pairs a method with what it can use (``tuner.search.space``): a head with the
method it serves, n-gram lookup lengths with an engine that takes them, and so on. Method names and
what each speculates with are ``tuner.engines.speculation``'s; how an engine runs one is its adapter's.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tuner.engines.base import EngineAdapter, ModelSpec
from tuner.engines.drafts import check_fits, draft_kind
from tuner.engines.env import EngineEnv
from tuner.engines.speculation import (
    DRAFT_MODEL,
    LABELS,
    METHODS,
    OFF,
    WITH_DRAFT,
    WITH_TARGET_LAYERS,
    unavailable,
)
from tuner.errors import ConfigError


@dataclass(frozen=True)
class Offer:
    """One engine's speculation in a study: its methods in the space's order (``OFF`` where listed),
    the drafts and heads of each method that takes one, and each method's engine parameters."""

    methods: tuple[str, ...] = ()
    drafts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    params: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def speculates(self) -> bool:
        return any(m != OFF for m in self.methods)


EngineAt = tuple[EngineAdapter, str, Container[str] | None]  # adapter, version, packages its environment holds


def draft_kinds(named: Sequence[str], model: ModelSpec) -> dict[str, str]:
    """The kind of each draft the space names: one of the model's, or a folder (checked against the
    target); any other name is bad input, never passed to an engine as a path."""
    kinds = {}
    for name in named:
        if name in model.drafts:
            kinds[name] = model.kind(name)
        elif (Path(name) / "config.json").is_file():
            kind, path = draft_kind(name)
            check_fits(kind, path, model.path)
            kinds[name] = kind
        elif name not in METHODS:  # a method named as a draft is the method (spaces written before methods)
            known = ", ".join(model.drafts) or "none: give one with --draft-model"
            raise ConfigError(f"parameters.draft_model: no draft {name!r} here; drafts: {known}")
    return kinds


def offer(
    listed: Sequence[str], named: Sequence[str] | None, engine: EngineAt, model: ModelSpec
) -> tuple[Offer, list[str]]:
    """One engine's offer, and a line for each listed method it leaves out."""
    adapter, version, modules = engine
    kinds = draft_kinds(named, model) if named is not None else {d: model.kind(d) for d in model.drafts}
    methods, drafts, params, notes = [], {}, {}, []
    for method in listed:
        if method == OFF:
            methods.append(method)
            continue
        serving = tuple(d for d, kind in kinds.items() if kind == method)
        why = unavailable(adapter.name, adapter.spec_methods, method, version, modules)
        if why is None and method in WITH_TARGET_LAYERS and model.mtp_layers < 1:
            why = f"the model {model.path} ships no MTP layers"
        if why is None and method in WITH_DRAFT and not serving:
            what, flag = ("", "PATH") if method == DRAFT_MODEL else (" head", f"{method}:PATH")
            why = f"no {LABELS[method]}{what} here (give one with --draft-model {flag})"
        if why is not None:
            notes.append(f"{adapter.name} {version}: {LABELS[method]} left out of its space: {why}")
            continue
        methods.append(method)
        params[method] = adapter.spec_methods[method].params
        if method in WITH_DRAFT:
            drafts[method] = serving
    return Offer(tuple(methods), drafts, params), notes


def study_offers(
    listed: Sequence[str], named: Sequence[str] | None, engines: Mapping[str, EngineAt], model: ModelSpec
) -> tuple[dict[str, Offer], list[str]]:
    """Every engine's offer, and the lines saying what each leaves out."""
    offers, notes = {}, []
    for name, engine in engines.items():
        offers[name], said = offer(listed, named, engine, model)
        notes += said
    return offers, notes


def engines_at(engines: Mapping[str, tuple[EngineAdapter, EngineEnv]]) -> dict[str, EngineAt]:
    """A study's engines as offers need them: adapter, version and the packages its environment holds."""
    return {name: (adapter, env.version, env.modules) for name, (adapter, env) in engines.items()}
