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
from tuner.measure.capacity import CapacitySearch, Step
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


def _early_steps(plan: CapacityPlan, capacity: dict[str, Any], tier: str) -> dict[float, Step]:
    """The steps a look passed early at rates the tiers searched before ``tier`` (in the plan's order)
    served again whole, by rate: main's search reads each with the whole serving. A look decides a
    step only when it decides every scored tier, and the studies' tiers are nested (each bound of a
    later tier at least the earlier one's), so an early pass of an earlier tier is one of this tier's."""
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


def _replay(
    plan: CapacityPlan, capacity: dict[str, Any], tier: str, prune: bool
) -> tuple[CapacitySearch, int, float | None]:
    """Main's search of ``tier`` fed the recorded steps in turn, each where it proposes that rate, with
    what main reads beside them (``_early_steps``): the search, how many recorded steps it took, and
    what it proposed instead of the next one (all of them taken where it searched as the study did)."""
    steps = [_step(s) for s in capacity["tiers"][tier]["steps"]]
    first = steps[0].rate_req_s
    # the incumbent (the best so far) is not stored: a first step off the start rate was one
    search = plan.search(None if math.isclose(first, plan.start_rate) else first, prune)
    early = _early_steps(plan, capacity, tier)
    read_early = {round(s.rate_req_s, 6) for s in steps if not s.held}
    for i, step in enumerate(steps):
        proposed = search.next_rate()
        if proposed is None or not math.isclose(proposed, step.rate_req_s, rel_tol=1e-9):
            return search, i, proposed
        key = round(step.rate_req_s, 6)
        if key in early and key not in read_early:  # main reads the earlier tier's early pass first
            search.record(early[key], measured=False)
            read_early.add(key)
        search.record(step)
    return search, len(steps), None


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
        search, taken, proposed = _replay(plan, _capacity(db, number), tier, prune)
        assert taken == len(stored["steps"]), (
            f"{db.name} trial {number} {tier}: step {taken} proposed {proposed}, the study served "
            f"{stored['steps'][taken]['rate_req_s']}"
        )
        assert search.next_rate() is None, f"{db.name} trial {number} {tier}: main's search would go on"
        result = search.result()
        assert (result.capacity_req_s, result.stop_reason) == (stored["capacity_req_s"], stored["stop_reason"]), (
            f"{db.name} trial {number} {tier}"
        )


def test_main_reads_the_withdrawn_repeats_relaxed_claims_off_their_own_steps() -> None:
    """SGLang's defaults' repeats 2 and 3 on the H100 (trial 6), withdrawn in session 52: their relaxed
    tier read only the whole serving of 6.98 req/s, not the look's early pass the interactive claim
    stood on, and claimed 6.65. Main, fed the same steps, claims 6.98 below 7.61, resolved, before the
    steps the study went on to serve (reports/gpu-h100.md, "The finalists so far")."""
    plan = _plan(H100_STUDY)
    withdrawn = recorded_study_attrs(H100_STUDY)["finalist_runs_withdrawn"]["6"]
    runs = {r["repeat"]: r for r in withdrawn}
    assert set(runs) == {2, 3}
    for repeat, run in sorted(runs.items()):
        stored = run["capacity"]["tiers"]["relaxed"]
        assert math.isclose(stored["capacity_req_s"], 6.652005, rel_tol=1e-6), "the tag claimed 6.65"
        search, taken, proposed = _replay(plan, run["capacity"], "relaxed", prune=False)
        assert taken < len(stored["steps"]) and proposed is None, f"repeat {repeat}: main stops sooner"
        result = search.result()
        low, high = result.bracket_req_s
        assert result.stop_reason == "resolved" and high is not None, repeat
        assert (round(result.capacity_req_s, 2), round(low, 2), round(high, 2)) == (6.98, 6.98, 7.61), repeat
