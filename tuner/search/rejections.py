"""Configs the engine's own validation must reject, learned from one it rejected: not booted again.

vLLM refuses, at engine start, a speculative config whose draft slots leave no token to schedule
("max_num_scheduled_tokens is set to 0 based on the speculative decoding settings"; vLLM 0.26 on
the H200 rejected the smaller chunks with a draft model, each well into its boot:
reports/gpu-h200/capacity/block4/NOTES.md). The direction of
that budget does not change between versions: fewer batched tokens (``chunk_size``), more draft
slots per request or more sequences only make it worse. So a config that is no easier than a
rejected one on all three, with the same engine, is rejected alike and recorded as
``invalid_config`` without a boot (``rejected_like`` names the trial). The slots a config's
drafting takes are the adapter's fact (``EngineAdapter.draft_slots``); where the engine does not
say, only the same method and draft with at least as many speculative tokens counts as no easier. Other
rejections are not generalised: their cause need not be monotone in anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import optuna

from tuner.engines.base import Config, EngineAdapter
from tuner.engines.speculation import OFF, draft_of, method_of

REJECTED = "invalid_config"


def rejected_like(
    config: Config, trials: Iterable[optuna.trial.FrozenTrial], adapter: EngineAdapter
) -> optuna.trial.FrozenTrial | None:
    """The first earlier trial rejected for its draft slots that ``config`` is no easier than."""
    if config.is_default or method_of(config.params) == OFF or not adapter.draft_slots_signature:
        return None
    signature = re.compile(adapter.draft_slots_signature)
    for t in trials:
        a = t.user_attrs
        if a.get("failure") != REJECTED or a.get("engine") != config.engine or a.get("rejected_like") is not None:
            continue  # a rejection told from another is not evidence of its own
        if signature.search(a.get("log_tail") or "") and no_easier(config.params, a.get("config") or {}, adapter):
            return t
    return None


def no_easier(new: Mapping[str, Any], old: Mapping[str, Any], adapter: EngineAdapter) -> bool:
    """At most the batched tokens, at least the draft slots and sequences. An absent parameter is the
    engine's default: comparable only with another absent one."""
    slots_new, slots_old = adapter.draft_slots(new), adapter.draft_slots(old)
    if slots_new is None or slots_old is None:
        same = (method_of(new), draft_of(new)) == (method_of(old), draft_of(old))
        drafting = same and _compare(
            new.get("num_speculative_tokens"), old.get("num_speculative_tokens"), lambda n, o: n >= o
        )
    else:
        drafting = slots_new >= slots_old > 0
    return (
        drafting
        and _compare(new.get("chunk_size"), old.get("chunk_size"), lambda n, o: n <= o)
        and _compare(new.get("max_num_seqs"), old.get("max_num_seqs"), lambda n, o: n >= o)
    )


def _compare(new: int | None, old: int | None, holds: Any) -> bool:
    if new is None or old is None:
        return new is None and old is None
    return bool(holds(new, old))
