"""Every distinct config of a discrete search space: the grid that ``--sampler grid`` walks.

Optuna's ``GridSampler`` takes the product of every parameter's values, conditional ones included,
so a space where the draft model matters only when speculation is on would boot the same
no-speculation config once per draft. Here speculation is expanded as the trial samples it
(``tuner.search.space.speculation_distributions``): off is one point, and each method is paired
with every K, every draft or head that serves it and every value of its engine's own parameters.
A float range needs a ``step``; an integer range gives every integer in it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping
from typing import Any

from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from tuner.engines.speculation import OFF
from tuner.errors import ConfigError
from tuner.search.space import FractionChoices, FractionRange, Parameters, Space, speculation_distributions
from tuner.search.speculation import Offer


def _fractions(spec: FractionRange | FractionChoices) -> list[float]:
    if isinstance(spec, FractionChoices):
        return list(spec.choices)
    if spec.step is None:
        raise ConfigError("--sampler grid: memory_fraction needs a step (or choices) to make a grid")
    n = int(round((spec.high - spec.low) / spec.step + 1e-9))
    return [round(spec.low + i * spec.step, 6) for i in range(n + 1)]


def _values(dist: BaseDistribution) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    assert isinstance(dist, IntDistribution)
    return list(range(dist.low, dist.high + 1))


def _product(axes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    return [{k: v for part in combo for k, v in part.items()} for combo in itertools.product(*axes)]


def _speculation(p: Parameters, offer: Offer) -> list[dict[str, Any]]:
    """Each method with every value of what it takes, and off once (Optuna names, unprefixed)."""
    dists = speculation_distributions(p, offer)
    if not dists:
        return [{}]
    points: list[dict[str, Any]] = []
    for method in offer.methods:
        if method == OFF:
            points.append({"spec_method": OFF})
            continue
        axes = [[{"spec_method": method}]]
        taken = ["num_speculative_tokens", f"{method}.draft", *offer.params.get(method, ())]
        axes += [[{name: v} for v in _values(dists[name])] for name in taken if name in dists]
        points += _product(axes)
    return points


def engine_points(p: Parameters, offer: Offer) -> list[dict[str, Any]]:
    """Every distinct parameter set of one engine's sub-space (unprefixed names)."""
    axes: list[list[dict[str, Any]]] = []
    for key in ("chunk_size", "max_num_seqs", "tensor_parallel"):
        spec = getattr(p, key)
        if spec is not None:
            axes.append([{key: v} for v in spec.choices])
    if p.memory_fraction is not None:
        axes.append([{"memory_fraction": v} for v in _fractions(p.memory_fraction)])
    axes.append(_speculation(p, offer))
    return _product(axes)


def grid_points(space: Space, offers: Mapping[str, Offer]) -> list[dict[str, Any]]:
    """Every distinct config as Optuna params (``engine`` plus ``<engine>.<param>``), in a stable order."""
    points = []
    for engine, offer in offers.items():
        for params in engine_points(space.parameters, offer):
            points.append({"engine": engine, **{f"{engine}.{k}": v for k, v in params.items()}})
    return points


def shuffled(points: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """The grid in a seeded order, so a study cut short by its budget is a uniform sample of it."""
    order = list(points)
    random.Random(seed).shuffle(order)
    return order
