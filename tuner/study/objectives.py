"""The objectives a study can optimise (``--objective``): one registry that the flags, the worker,
the scoring, the finalists and the report all read.

* ``capacity`` (default): the highest request rate the config carries while the target share of
  requests meets one SLO tier (``--tier``); see ``tuner.measure.capacity``.
* ``capacity-pareto``: capacity under the interactive tier against capacity under the relaxed
  tier, both maximised, since the two tiers' winners differ.
* ``pareto``: TTFT p95 in ms (minimise) against output throughput in tokens/s (maximise).
* ``goodput``: requests per second that met every SLO (maximise); see ``tuner.measure.goodput``.
* ``throughput``: output throughput (maximise) subject to the SLOs: a trial whose p95 TTFT, TPOT
  or end-to-end time exceeds its bound is infeasible, by how far it exceeds it.
"""

from __future__ import annotations

from dataclasses import dataclass

from optuna.study import StudyDirection

MIN, MAX = StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE


@dataclass(frozen=True)
class Objective:
    """What one objective makes of a trial: its values and directions, whether a trial searches a
    capacity for it, whether it needs SLOs, and what the finalists' repeats are compared on."""

    name: str
    values: tuple[tuple[str, StudyDirection], ...]  # the trial's metrics that are the study's values
    capacity: bool = False  # each trial searches its capacity under SLO tiers
    needs_slo: bool = True
    # what repeats compare, in order; None: goodput where the study has SLOs, else output throughput
    repeats_compare: tuple[str, ...] | None = None

    def deciders(self, has_slo: bool) -> tuple[str, ...]:
        if self.repeats_compare is not None:
            return self.repeats_compare
        return ("goodput_req_s",) if has_slo else ("output_throughput_tok_s",)


REGISTRY: dict[str, Objective] = {
    o.name: o
    for o in (
        Objective("capacity", (("capacity_req_s", MAX),), capacity=True, repeats_compare=("capacity_req_s",)),
        Objective(
            "capacity-pareto",
            (("capacity_interactive_req_s", MAX), ("capacity_relaxed_req_s", MAX)),
            capacity=True,
            repeats_compare=("capacity_interactive_req_s", "capacity_relaxed_req_s"),
        ),  # fmt: skip
        Objective("pareto", (("ttft_p95_ms", MIN), ("output_throughput_tok_s", MAX)), needs_slo=False),
        Objective("goodput", (("goodput_req_s", MAX),)),
        Objective("throughput", (("output_throughput_tok_s", MAX),)),
    )
}
DEFAULT_OBJECTIVE = "capacity"  # what tuner search optimises unless --objective says otherwise
# A study that records no objective predates the attribute (7dfcbef), when every study was pareto.
UNRECORDED_OBJECTIVE = "pareto"
CAPACITY_OBJECTIVES = tuple(name for name, o in REGISTRY.items() if o.capacity)


def objective_named(name: str | None) -> Objective:
    """A study's objective as it records it; one that records none is ``UNRECORDED_OBJECTIVE``'s."""
    return REGISTRY[name or UNRECORDED_OBJECTIVE]


def is_capacity(name: str | None) -> bool:
    return name in CAPACITY_OBJECTIVES
