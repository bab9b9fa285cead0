"""What a study's own trials say not to boot: one question the search and ``tuner plan --study`` ask.

Two outcomes generalise past the config that had them: the engine rejecting a speculative config for
its draft slots (``tuner.search.rejections``: a config no easier is rejected alike) and a draft
measured accepting next to nothing (``tuner.search.acceptance``: the same engine and draft in a chain
gains nothing anywhere). The search tells such a config without a boot; the plan leaves it out, so
the rows it prints are the configs a search of that study would boot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from tuner.engines.base import Config, EngineAdapter
from tuner.search.acceptance import idle_draft_like
from tuner.search.rejections import rejected_like


@dataclass(frozen=True)
class Learned:
    """An earlier trial (``like``) whose outcome says ``config`` need not boot, and why, in words."""

    like: optuna.trial.FrozenTrial
    why: str
    rejected: bool  # the engine rejected ``like`` for its draft slots (else: its draft was measured idle)


def learned_screen(config: Config, ran: Sequence[optuna.trial.FrozenTrial], adapter: EngineAdapter) -> Learned | None:
    """The first of the learned screens that tells ``config`` from the trials that ``ran`` (finished or
    pruned): a rejection for draft slots first (it would not boot at all), then an idle draft."""
    finished = [t for t in ran if t.state == optuna.trial.TrialState.COMPLETE]
    rejected = rejected_like(config, finished, adapter)
    if rejected is not None:
        why = f"no easier than trial {rejected.number}, which the engine rejected for its draft slots"
        return Learned(rejected, why, rejected=True)
    idle = idle_draft_like(config, ran)
    if idle is None:
        return None
    like, gain = idle
    why = (f"its draft gained {gain:.4f} tokens per verify step in trial {like.number}, too little to "
           f"repay drafting at K={config.params.get('num_speculative_tokens')}")  # fmt: skip
    return Learned(like, why, rejected=False)
