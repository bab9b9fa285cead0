"""What a study optimises (``--objective``), and a trial's values and constraint under it.

* ``capacity`` (default): the highest request rate the config carries while the target share of
  requests meets one SLO tier (``--tier``, default interactive); see ``tuner.measure.capacity``.
* ``capacity-pareto``: capacity under the interactive tier against capacity under the relaxed
  tier, both maximised, since the two tiers' winners differ.
* ``pareto``: TTFT p95 in ms (minimise) against output throughput in tokens/s (maximise).
* ``goodput``: requests per second that met every SLO (maximise); see ``tuner.measure.goodput``.
* ``throughput``: output throughput (maximise) subject to the SLOs: a trial whose p95 TTFT, TPOT
  or end-to-end time exceeds its bound is infeasible, by how far it exceeds it.

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

MIN, MAX = StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE
OBJECTIVES: dict[str, tuple[tuple[str, StudyDirection], ...]] = {
    "capacity": (("capacity_req_s", MAX),),
    "capacity-pareto": (("capacity_interactive_req_s", MAX), ("capacity_relaxed_req_s", MAX)),
    "pareto": (("ttft_p95_ms", MIN), ("output_throughput_tok_s", MAX)),
    "goodput": (("goodput_req_s", MAX),),
    "throughput": (("output_throughput_tok_s", MAX),),
}


DEFAULT_OBJECTIVE = "capacity"  # what tuner search optimises unless --objective says otherwise
DIRECTIONS = [d for _, d in OBJECTIVES["pareto"]]  # TTFT p95 (minimise), output throughput (maximise)


CAPACITY_OBJECTIVES = ("capacity", "capacity-pareto")


def is_capacity(objective: str) -> bool:
    return objective in CAPACITY_OBJECTIVES


def check_objective(objective: str, slo: Mapping[str, float]) -> None:
    if objective not in OBJECTIVES:
        raise ConfigError(f"--objective {objective!r}: expected one of {', '.join(OBJECTIVES)}")
    if objective != "pareto" and not slo:
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


def violation(result: TrialResult, objective: str = "pareto", slo: Mapping[str, float] | None = None) -> float:
    if result.failure is not None:
        return 1.0
    errors = max(0.0, result.metrics.get("error_rate", 1.0) - MAX_ERROR_RATE)
    return errors + slo_excess(objective, result.metrics, slo or {})
