"""Main's capacity search against every search the committed GPU studies ran: fed each recorded step
in turn, it must propose the rates the study served and stop where the study stopped. A study spans
sessions on its tag while main's search changes, and its finalists' tag may move only past changes
that would not have searched its recorded trials otherwise (the RUNBOOK, "Retaken in session 45"):
a change that would fails here, naming the trial. While a study runs, such a change waits for it."""

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
        for i, step in enumerate(steps):
            proposed = search.next_rate()
            assert proposed is not None and math.isclose(proposed, step.rate_req_s, rel_tol=1e-9), (
                f"{db.name} trial {number} {tier}: step {i} proposed {proposed}, the study served {step.rate_req_s}"
            )
            search.record(step)
        assert search.next_rate() is None, f"{db.name} trial {number} {tier}: main's search would go on"
        result = search.result()
        assert (result.capacity_req_s, result.stop_reason) == (stored["capacity_req_s"], stored["stop_reason"]), (
            f"{db.name} trial {number} {tier}"
        )
