"""Rules the capacity measurement replaced, kept only so the benchmarks can run them beside the current ones.

- ``saturation_parts``: ``tuner.measure.capacity.saturated`` over another number of the judged
  window's parts, through the module's own constants; (2, 2.0) is the rule of capacity check 6.
- ``PreviousSearch`` (``PreviousPlan`` runs it): the search of capacity check 6, where every step that
  did not pass, an undecided one too, was a fail.
- ``AnySamplePlan``: the looks of capacity checks 6 and 7, which decided a step on however few
  outcomes were known by then (now a look waits for the plan's ``min_requests``), and their monitor,
  which judged the saturation test at every tick (now every ``SATURATION_EVERY_S``).
- ``EveryTickPlan``: the looks of capacity check 8 (the current ones) with that monitor.
- ``HalvingPlan``: the search until session 45 (2026-12-07), which, with no decided pass, halved below
  the lowest rate that did not pass even where every step there leaned to a pass (now it steps down
  one resolution: ``CapacitySearch._near_knee``).
- ``LeaningTopPlan``: a rule tried and not adopted yet (2026-12-07): where the bracket's top (the
  lowest rate above the capacity not passed) leaned to a pass, step one resolution below it rather
  than bisect, since the knee is at or above it. Not adopted while the GPU studies' finalists run:
  it would search their recorded trials otherwise (tests/unit/measure/test_recorded_searches.py).
- ``RungClimbPlan``: a rule tried, not adopted while the GPU studies' finalists run (2026-12-07): a
  finalist's repeat (an incumbent, pruning off) whose claim and the rung above it passed climbs one
  resolution at a time rather than doubling, since its knee is expected near its trial's claim.
- ``WarmTierPlan``: a rule tried and not adopted (2026-12-05): a later tier's search starts from
  every step the earlier tiers served, judged under its own SLO (the tuner's tiers search afresh and
  share a step only where they ask the same rate; ``bench_tier_search`` measures both).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tuner.measure import capacity
from tuner.measure.capacity import FLOOR_DIVISOR, PRUNE_SHARE, CapacitySearch
from tuner.measure.rate_steps import CapacityPlan, Measured, judge_served


@contextmanager
def saturation_parts(parts: int, sigmas: float) -> Iterator[None]:
    """Within it, ``tuner.measure.capacity.saturated`` judges growth over ``parts`` parts of the window at
    ``sigmas`` each: (2, 2.0) is the rule of capacity check 6, kept only for the benchmarks to compare."""
    before = capacity.SATURATION_PARTS, capacity.PART_SIGMAS
    capacity.SATURATION_PARTS, capacity.PART_SIGMAS = parts, sigmas
    try:
        yield
    finally:
        capacity.SATURATION_PARTS, capacity.PART_SIGMAS = before


class PreviousSearch(CapacitySearch):
    """The rule before: every step that did not pass, an undecided one too, was a fail."""

    def lowest_fail(self) -> float | None:
        fails = [s.rate_req_s for s in self.steps if not s.passed]
        return min(fails) if fails else None

    def _propose(self) -> tuple[float | None, str | None]:
        if not self.steps:
            return (self.incumbent if self.incumbent is not None else min(self.start_rate, self.max_rate)), None
        fail, best = self.lowest_fail(), self.capacity()
        if fail is None:
            if best >= self.max_rate:
                return None, "max_rate"
            return min(best * self.growth, self.max_rate), None
        if best > 0:
            return (None, "resolved") if (fail - best) / best <= self.resolution else (math.sqrt(best * fail), None)
        if self.incumbent is not None and self.prune:
            return (PRUNE_SHARE * self.incumbent, None) if len(self.steps) < 2 else (None, "pruned")
        floor = min(self.start_rate, self.incumbent or self.start_rate) / FLOOR_DIVISOR
        return (fail / 2, None) if fail / 2 >= floor * (1 - 1e-9) else (None, "no_capacity")


@dataclass(frozen=True)
class AnySamplePlan(CapacityPlan):
    """The looks of capacity check 7: a look decided on the outcomes it knew, however few; and its
    monitor, which judged the saturation test at every tick."""

    @property
    def look_sample(self) -> int:
        return 1

    @property
    def saturation_every_s(self) -> float:
        return 0.0


@dataclass(frozen=True)
class PreviousPlan(AnySamplePlan):
    """The search of capacity check 6 (``PreviousSearch``), with its looks on any sample."""

    search_rule = PreviousSearch


class HalvingSearch(CapacitySearch):
    """The current search, but with no decided pass it halves below the lowest rate not passed, even
    one whose steps all leaned to a pass."""

    def _near_knee(self, rate: float) -> bool:
        return False


@dataclass(frozen=True)
class HalvingPlan(CapacityPlan):
    """The current rules with ``HalvingSearch``: the search until session 45."""

    search_rule = HalvingSearch


class LeaningTopSearch(CapacitySearch):
    """The current search, but below a bracket's top that leaned to a pass it steps one resolution
    down (never below the bisection's midpoint) rather than to the midpoint."""

    def _between(self, best: float, upper: float) -> float:
        midpoint = super()._between(best, upper)
        return max(upper / (1 + self.resolution), midpoint) if self._near_knee(upper) else midpoint


@dataclass(frozen=True)
class LeaningTopPlan(CapacityPlan):
    """The current rules with ``LeaningTopSearch``: a candidate, not adopted yet."""

    search_rule = LeaningTopSearch


class RungClimbSearch(CapacitySearch):
    """The current search, but a finalist's repeat climbs past its claim one resolution at a time."""

    def _propose(self) -> tuple[float | None, str | None]:
        rate, reason = super()._propose()
        climbing = self.incumbent is not None and not self.prune and self.lowest_fail() is None
        rung = self._leaning(None) * (1 + self.resolution)
        if climbing and rate is not None and rung > 0 and rate > rung * (1 + 1e-9):
            return min(rung, self.max_rate), None
        return rate, reason


@dataclass(frozen=True)
class RungClimbPlan(CapacityPlan):
    """The current rules with ``RungClimbSearch``: a candidate for repeats, not adopted."""

    search_rule = RungClimbSearch


@dataclass(frozen=True)
class EveryTickPlan(CapacityPlan):
    """The rules of capacity check 8: the current looks, the saturation test judged at every tick."""

    @property
    def saturation_every_s(self) -> float:
        return 0.0


class WarmTierSearch(CapacitySearch):
    """Before it proposes a rate, hears every step served so far (``served``: the steps of the
    search's earlier tiers), judged under its own ``slo``, as steps it did not measure."""

    def __init__(self, plan: CapacityPlan, slo: Mapping[str, float], served: list[Measured], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._plan, self._slo, self._served, self._asked = plan, slo, served, False

    def next_rate(self) -> float | None:
        if not self._asked:
            self._asked = True
            latest = {round(m.rate_req_s, 6): m for m in self._served}  # a rate served again: the latest stands
            for m in latest.values():
                self.record(judge_served(m, self._slo, self._plan), measured=False)
        return super().next_rate()


@dataclass(frozen=True)
class WarmTierPlan(CapacityPlan):
    """The current rules with ``WarmTierSearch``: ``served`` is the list the search's ``measure``
    appends each served step to, and the tiers are searched in ``scored`` order, one search each."""

    served: list[Measured] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    def search(self, incumbent: float | None, prune: bool) -> CapacitySearch:
        tier = self.scored[len(self._made)]
        self._made.append(tier)
        return WarmTierSearch(
            self, self.tiers[tier], self.served, target=self.target, resolution=self.resolution,
            start_rate=self.start_rate, growth=self.growth, incumbent=incumbent, max_steps=self.max_steps,
            max_rate=self.max_rate, prune=prune,
        )  # fmt: skip
