"""Drafts that accept next to nothing: a config that would speculate with one is not booted.

A draft or head's acceptance is its agreement with the target on the study's workload. Chunk size,
memory fraction and batch change how fast the engine runs it, not what the target accepts. So once a
trial on one engine has measured a draft gaining almost no token per verify step, the same engine
speculating with the same draft elsewhere in the space gains almost nothing too, and pays for the
draft's passes: it is dominated by the same config without speculation. Such a config is told as
pruned without a boot; ``idle_draft_like`` names the trial that measured the draft.

The bound, for K' proposed tokens against a measured K: each accepted token needs the ones before it
accepted, so a step gains at most K' times the chance that the first is accepted, and that chance is
at most the measured gain per step (``mean_accept_len`` less the token every step yields anyway).
A config is screened when K' times the measured gain is under ``IDLE_GAIN_PER_STEP``. Only a chain
counts: an engine's tree proposing several first tokens (top-k above 1) may accept where a chain did
not, so the tree's width must match. The evidence is the highest gain the trial measured, over its
whole run or at any step of its capacity search; a trial that measured none (one that died at boot)
is no evidence. The engine decides how its drafting runs (an engine may load or verify a head
differently), so one engine's measurement never screens another's. N-gram lookup, suffix decoding
and MTP name no draft and are never screened: what the first two accept depends on their own
parameters, and MTP's layers are the target's. ``--no-screen`` turns this off with the other screens.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from tuner.engines.base import Config
from tuner.engines.speculation import draft_of, method_of

# A draft that adds under one accepted token per hundred verify steps cannot repay the passes it costs:
# each step runs the draft K times and verifies K tokens for a gain the target alone nearly matches.
IDLE_GAIN_PER_STEP = 0.01
# the trials that may have measured a draft: served whole, or pruned after serving some steps
MEASURED_STATES = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)


def idle_draft_like(
    config: Config, trials: Iterable[optuna.trial.FrozenTrial]
) -> tuple[optuna.trial.FrozenTrial, float] | None:
    """The first earlier trial on the same engine whose draft (the one ``config`` would use, in a chain
    of the same width) gained so little per step that ``config``'s K could not make it worth running;
    with that gain."""
    params = config.params
    draft = draft_of(params)
    if config.is_default or draft is None:  # off, or a method without a draft
        return None
    k = int(params.get("num_speculative_tokens") or 0)
    for t in trials:
        a = t.user_attrs
        if a.get("engine") != config.engine or a.get("idle_draft_like") is not None:
            continue  # a trial told from another measured nothing itself
        old = a.get("config") or {}
        if (method_of(old), draft_of(old), _width(old)) != (method_of(params), draft, _width(params)):
            continue
        gain = measured_gain(a.get("speculation"))
        if gain is not None and k * gain < IDLE_GAIN_PER_STEP:
            return t, gain
    return None


def measured_gain(speculation: Mapping[str, Any] | None) -> float | None:
    """The highest accepted tokens per verify step a trial measured: over the trial, and at each step
    of its capacity search (None: it measured none, as a trial that died at boot)."""
    spec = speculation or {}
    lengths = [spec.get("mean_accept_len"), *(s.get("mean_accept_len") for s in spec.get("steps") or [])]
    known = [float(v) - 1.0 for v in lengths if isinstance(v, int | float)]
    return max(known) if known else None


def _width(params: Mapping[str, Any]) -> int:
    """Top-k of the first proposal: 1 for a chain, which every config without a tree is."""
    tree = params.get("spec_tree")
    return int(tree[0]) if isinstance(tree, list | tuple) and tree else 1
