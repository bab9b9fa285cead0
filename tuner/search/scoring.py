"""A trial's values and constraint under the study's objective (``tuner.study.objectives``: the one
registry of what each objective is).

A failed trial gets the worst value of each objective (inf for a minimised one, 0 otherwise), and a
positive constraint (Optuna's ``Trial.set_constraint``, which every built-in sampler honours), so the
sampler learns where engines break; such a trial is never on the feasible front and never exported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from optuna.study import StudyDirection

from tuner.errors import ConfigError
from tuner.measure.trial import MAX_ERROR_RATE, TrialResult
from tuner.study.objectives import CAPACITY_OBJECTIVES, DEFAULT_OBJECTIVE, MAX, MIN, REGISTRY, is_capacity

__all__ = [
    "CAPACITY_OBJECTIVES", "DEFAULT_OBJECTIVE", "DIRECTIONS", "MAX", "MIN", "OBJECTIVES", "REGISTRY",
    "check_objective", "directions", "is_capacity", "metric_names", "slo_excess", "values", "violation",
]  # fmt: skip

# each objective's values, derived from the registry
OBJECTIVES: dict[str, tuple[tuple[str, StudyDirection], ...]] = {n: o.values for n, o in REGISTRY.items()}
DIRECTIONS = [d for _, d in OBJECTIVES["pareto"]]  # TTFT p95 (minimise), output throughput (maximise)


def check_objective(objective: str, slo: Mapping[str, float]) -> None:
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if REGISTRY[objective].needs_slo and not slo:
        raise ConfigError(f"--objective {objective} needs SLOs: give --slo ttft_p95_ms=...,tpot_p95_ms=...")


def directions(objective: str) -> list[StudyDirection]:
    return [direction for _, direction in OBJECTIVES[objective]]


def metric_names(objective: str) -> list[str]:
    return [name for name, _ in OBJECTIVES[objective]]


def values(objective: str, metrics: Mapping[str, float], failed: bool) -> list[float]:
    out = []
    for name, direction in OBJECTIVES[objective]:
        worst = math.inf if direction == MIN else 0.0
        value = metrics.get(name, worst)
        out.append(worst if failed or not math.isfinite(value) else value)
    return out


def slo_excess(objective: str, metrics: Mapping[str, float], slo: Mapping[str, float]) -> float:
    """For ``throughput``: the summed relative excess of each p95 over its bound (0 when within)."""
    if objective != "throughput":
        return 0.0
    excess = 0.0
    for key, bound in slo.items():
        measured = metrics.get(key, math.inf)
        excess += max(0.0, (measured - bound) / bound) if math.isfinite(measured) else 1.0
    return excess


def violation(result: TrialResult, objective: str, slo: Mapping[str, float] | None = None) -> float:
    if result.failure is not None:
        return 1.0
    errors = max(0.0, result.metrics.get("error_rate", 1.0) - MAX_ERROR_RATE)
    return errors + slo_excess(objective, result.metrics, slo or {})
