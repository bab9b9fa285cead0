"""Main's capacity search against every search the committed GPU studies ran: fed each recorded step
in turn, it must propose the rates the study served and stop where the study stopped. A study spans
sessions on its tag while main's search changes, and its finalists' tag may move only past changes
that would not have searched its recorded trials otherwise (the RUNBOOK, "Retaken in session 45"):
a change that would fails here, naming the trial. While a study runs, such a change waits for it.

A tier reads what main's search reads: every step served at a rate it asks, so where an earlier tier
served a rate twice (a look's early pass, then the same rate whole to confirm it) and the recorded
tier kept only the whole serving (the studies' tags read the latest step alone), the early step is
read before it."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from tests.unit.study_files import H100_STUDY, H200_CAPACITY_BLOCK4, H200_STUDY, recorded_attrs, recorded_study_attrs
from tuner.measure.capacity import Step
from tuner.measure.rate_steps import CapacityPlan
from tuner.study.attrs import DEFAULT_KIND

STUDIES = (H200_CAPACITY_BLOCK4, H100_STUDY, H200_STUDY)
_STEP_FIELDS = {f.name for f in dataclasses.fields(Step)}


def _plan(db: Path) -> CapacityPlan:
    stored = dict(recorded_study_attrs(db)["capacity_plan"])
    known = {f.name for f in dataclasses.fields(CapacityPlan)}
    stored["scored"] = tuple(stored["scored"])
    return CapacityPlan(**{k: v for k, v in stored.items() if k in known})


def _step(stored: dict[str, Any]) -> Step:
    kept = {k: v for k, v in stored.items() if k in _STEP_FIELDS}
    if kept.get("window_s") is not None:
        kept["window_s"] = tuple(kept["window_s"])
    return Step(**kept)


def _searches(db: Path) -> list[tuple[str, str, bool, dict[str, Any]]]:
    """(trial, tier, pruned allowed, the tier's stored search) for every tier search a trial ran, and
    every one a finalist's stored repeat ran (pruning off; repeats withdrawn for a fault of the search
    are not main's to repeat)."""
    found = []
    for number, attrs in sorted(recorded_attrs(db).items()):
        found += _tier_searches(str(number), attrs.get("capacity"), attrs.get("config_kind") != DEFAULT_KIND)
    for number, runs in sorted((recorded_study_attrs(db).get("finalist_runs") or {}).items()):
        for run in runs:
            found += _tier_searches(f"{number} repeat {run['repeat']}", run.get("capacity"), False)
    return found


def _tier_searches(name: str, capacity: object, prune: bool) -> list[tuple[str, str, bool, dict[str, Any]]]:
    if not isinstance(capacity, dict):  # a failed trial, or a repeat stored before repeats kept their search
        return []
    tiers = (capacity.get("tiers") or {}).items()
    return [(name, tier, prune, stored) for tier, stored in tiers if stored.get("steps")]


def _early_steps(db: Path, number: str, tier: str) -> dict[float, Step]:
    """The steps a look passed early at rates the tiers searched before ``tier`` (in the plan's order)
    served again whole, by rate: main's search reads each with the whole serving. A look decides a
    step only when it decides every scored tier, and the studies' tiers are nested (each bound of a
    later tier at least the earlier one's), so an early pass of an earlier tier is one of this tier's."""
    plan = _plan(db)
    capacity = _capacity(db, number)
    earlier = list(plan.scored)[: list(plan.scored).index(tier)]
    early: dict[float, Step] = {}
    for before in earlier:
        assert all(plan.tiers[tier][k] >= v for k, v in plan.tiers[before].items()), f"{before} is not stricter"
        steps = [_step(s) for s in capacity["tiers"][before]["steps"]]
        whole = {round(s.rate_req_s, 6) for s in steps if s.held}
        for s in steps:
            if s.passed and not s.held and round(s.rate_req_s, 6) in whole:
                early.setdefault(round(s.rate_req_s, 6), s)
    return early


def _capacity(db: Path, name: str) -> dict[str, Any]:
    """The stored capacity record of a search named as ``_searches`` names it ("6", "6 repeat 2")."""
    number, _, repeat = name.partition(" repeat ")
    if not repeat:
        return dict(recorded_attrs(db)[int(number)]["capacity"])
    runs = recorded_study_attrs(db)["finalist_runs"][number]
    return dict(next(r for r in runs if str(r["repeat"]) == repeat)["capacity"])


@pytest.mark.parametrize("db", STUDIES, ids=lambda db: db.stem)
def test_main_searches_each_recorded_trial_as_its_study_did(db: Path) -> None:
    plan, searches = _plan(db), _searches(db)
    assert searches, f"{db.name}: no recorded capacity search"
    if db == H100_STUDY:  # blocks 14 on: the finalists' repeats keep their steps (block14/NOTES.md)
        assert {name for name, *_ in searches} >= {"0 repeat 2", "0 repeat 3"}
    for number, tier, prune, stored in searches:
        steps = [_step(s) for s in stored["steps"]]
        first = steps[0].rate_req_s
        # the incumbent (the best so far) is not stored: a first step off the start rate was one
        incumbent = None if math.isclose(first, plan.start_rate) else first
        search = plan.search(incumbent, prune)
        early = _early_steps(db, number, tier)
        read_early = {round(s.rate_req_s, 6) for s in steps if not s.held}
        for i, step in enumerate(steps):
            proposed = search.next_rate()
            assert proposed is not None and math.isclose(proposed, step.rate_req_s, rel_tol=1e-9), (
                f"{db.name} trial {number} {tier}: step {i} proposed {proposed}, the study served {step.rate_req_s}"
            )
            key = round(step.rate_req_s, 6)
            if key in early and key not in read_early:  # main reads the earlier tier's early pass first
                search.record(early[key], measured=False)
                read_early.add(key)
            search.record(step)
        assert search.next_rate() is None, f"{db.name} trial {number} {tier}: main's search would go on"
        result = search.result()
        assert (result.capacity_req_s, result.stop_reason) == (stored["capacity_req_s"], stored["stop_reason"]), (
            f"{db.name} trial {number} {tier}"
        )
