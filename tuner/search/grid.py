"""Every distinct config of a discrete search space: the grid that ``--sampler grid`` walks.

Optuna's ``GridSampler`` takes the product of every parameter's values, conditional ones included,
so a space where the draft model matters only when speculation is on would boot the same
no-speculation config once per draft. Here speculation is expanded as the trial samples it: K = 0
is one point, and each K > 0 is paired with every draft. A float range needs a ``step``; an integer
range gives every integer in it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from typing import Any

from tuner.errors import ConfigError
from tuner.search.space import FractionChoices, FractionRange, IntRange, Parameters, Space


def _fractions(spec: FractionRange | FractionChoices) -> list[float]:
    if isinstance(spec, FractionChoices):
        return list(spec.choices)
    if spec.step is None:
        raise ConfigError("--sampler grid: memory_fraction needs a step (or choices) to make a grid")
    n = int(round((spec.high - spec.low) / spec.step + 1e-9))
    return [round(spec.low + i * spec.step, 6) for i in range(n + 1)]


def _speculation(p: Parameters, drafts: Sequence[str]) -> list[dict[str, Any]]:
    choices = list(p.draft_model.choices) if p.draft_model is not None else list(drafts)
    ks = p.num_speculative_tokens
    if ks is None or not choices:
        return [{}]
    values = list(range(ks.low, ks.high + 1)) if isinstance(ks, IntRange) else list(ks.choices)
    points: list[dict[str, Any]] = []
    for k in dict.fromkeys(values):
        if k == 0:
            points.append({"num_speculative_tokens": 0})
        else:
            points += [{"num_speculative_tokens": k, "draft_model": d} for d in choices]
    return points


def engine_points(p: Parameters, drafts: Sequence[str]) -> list[dict[str, Any]]:
    """Every distinct parameter set of one engine's sub-space (unprefixed names)."""
    axes: list[list[dict[str, Any]]] = []
    for key in ("chunk_size", "max_num_seqs", "tensor_parallel"):
        spec = getattr(p, key)
        if spec is not None:
            axes.append([{key: v} for v in spec.choices])
    if p.memory_fraction is not None:
        axes.append([{"memory_fraction": v} for v in _fractions(p.memory_fraction)])
    axes.append(_speculation(p, drafts))
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)]


def grid_points(space: Space, engines: Sequence[str], drafts: Sequence[str]) -> list[dict[str, Any]]:
    """Every distinct config as Optuna params (``engine`` plus ``<engine>.<param>``), in a stable order."""
    points = []
    for engine in engines:
        for params in engine_points(space.parameters, drafts):
            points.append({"engine": engine, **{f"{engine}.{k}": v for k, v in params.items()}})
    return points


def shuffled(points: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The grid in a seeded order, so a study cut short by its budget is a uniform sample of it."""
    order = list(points)
    random.Random(seed).shuffle(order)
    return order
