"""The finalists' stress check, with scripted runs in place of engines (the real path: tests/e2e), and a dry
run of the H100 study's finalists stage on a copy of its file."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest

from tests.unit.study_files import H100_STUDY
from tuner.engines.base import Config, Device, LaunchSpec, ModelSpec
from tuner.errors import ConfigError
from tuner.measure.rate_steps import CapacityPlan
from tuner.measure.trial import TrialContext, TrialResult
from tuner.progress import Quiet
from tuner.search import finalists
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS, MAX
from tuner.study.attrs import DEFAULT_KIND
from tuner.study.feasible import feasible_pareto, feasible_trials
from tuner.workloads.base import Workload

SLO = {"ttft_p95_ms": 2000.0}
SPEC = LaunchSpec(engine="vllm", python="python3", module="vllm.entrypoints.openai.api_server", args=("--model", "m"),
                  host="127.0.0.1", port=8000, health_path="/health", served_model="m")  # fmt: skip


def _metrics(ttft: float, tok_s: float) -> dict[str, float]:
    return {"ttft_p95_ms": ttft, "output_throughput_tok_s": tok_s, "goodput_req_s": tok_s / 48, "error_rate": 0.0,
            "tpot_p95_ms": 20.0}  # fmt: skip


# trial number -> (its trial's metrics, its stress run's TTFT p95, or None when the stress run crashes)
PLAN: dict[int, tuple[dict[str, float], float | None]] = {
    0: (_metrics(900.0, 100.0), 1500.0),  # the engine default
    1: (_metrics(400.0, 200.0), 9000.0),  # the best config, which queues at peak: slo_collapse
    2: (_metrics(500.0, 180.0), 1200.0),  # the runner-up, which holds
    3: (_metrics(450.0, 150.0), None),  # dies at peak: oom_load
}


@pytest.fixture
def study() -> optuna.Study:
    study = optuna.create_study(directions=DIRECTIONS)
    study.set_user_attr("slo", SLO)
    for number, (metrics, _) in PLAN.items():
        kind = DEFAULT_KIND if number == 0 else "sampled"
        fixed = {"engine": "vllm"} | ({} if number == 0 else {"vllm.chunk_size": 512 * number})
        study.enqueue_trial(fixed, user_attrs={"config_kind": kind})
        trial = study.ask()
        trial.suggest_categorical("engine", ["vllm"])
        params = {} if number == 0 else {"chunk_size": trial.suggest_categorical("vllm.chunk_size", [512, 1024, 1536])}
        result = TrialResult(Config("vllm", params), SPEC, "0.32.0", metrics=metrics)
        study.tell(trial, record(trial, result, "pareto", SLO))
    return study


def _scripted(number: int, config: Config, ctx: TrialContext, repeat: int | None = None, stress: bool = False,
              **_: Any) -> TrialResult:  # fmt: skip
    metrics, peak = PLAN[number]
    result = TrialResult(config, SPEC, "0.32.0", metrics=dict(metrics))
    if stress:
        alive = peak is not None
        m = {"ttft_p95_ms": peak or float("nan"), "e2e_p95_ms": (peak or 0) + 500, "error_rate": 0.0 if alive else 1.0}
        log = "" if alive else "torch.OutOfMemoryError: CUDA out of memory"
        result.stress = {"metrics": m, "alive": alive, "killed": False, "log": log, "prompt_tokens": 996,
                         "concurrency": 4, "cache_reset": True}  # fmt: skip
    return result


@pytest.fixture
def ctx(tmp_path: Any) -> TrialContext:
    workload = Workload("rag", 0, (), (), 4, "test")
    return TrialContext({}, ModelSpec("m"), Device("cpu", "cpu", 1), workload, tmp_path, Quiet(), slo=SLO)


def test_configs_that_break_at_peak_are_marked_and_left_out(study: optuna.Study, ctx: TrialContext,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(finalists, "run_trial", _scripted)
    verdict = finalists.run_finalists(study, k=3, n=2, ctx=ctx, enforce_eager=True)
    checks = study.user_attrs["stress"]
    assert checks["1"]["failure"] == "slo_collapse" and checks["3"]["failure"] == "oom_load"
    assert checks["2"]["failure"] is None and checks["0"]["failure"] is None and checks["2"]["ran"]
    feasible = {t.number for t in feasible_trials(study)}
    assert feasible == {0, 2}, "a config that breaks at peak is never feasible"
    assert {t.number for t in feasible_pareto(study)} <= {0, 2}
    added = [t for t in study.trials if t.user_attrs.get("config_kind") == "stress_check"]
    assert sorted((t.user_attrs["stress_of"], t.user_attrs["failure"]) for t in added) == [
        (1, "slo_collapse"),
        (3, "oom_load"),
    ]
    assert all(t.constraints["failure_or_error_rate"] > 0 for t in added), "the sampler learns the region breaks"
    assert verdict["stress_failed"] == [1, 3] and 1 not in verdict["trials"]
    assert {f["trial"] for f in study.user_attrs["finalists"]} == {0, 1, 2, 3}


def test_when_every_finalist_breaks_the_next_config_is_checked(study: optuna.Study, ctx: TrialContext,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.setattr(finalists, "run_trial", _scripted)
    finalists.run_finalists(study, k=1, n=0, ctx=ctx, enforce_eager=True)  # only trial 1, which collapses
    checks = study.user_attrs["stress"]
    assert checks["1"]["failure"] == "slo_collapse"
    assert checks["2"]["failure"] is None, "the next config (trial 2) was checked and passed"
    assert "3" not in checks, "checking stops at the first config that passes"


def test_finalists_stopped_mid_way_resume_with_what_had_ended(study: optuna.Study, ctx: TrialContext,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    # a GPU lease holds a few boots and the finalists need a dozen: the machine goes away mid-way
    booted: list[tuple[int, int | None, bool]] = []

    def boots_until(limit: int | None) -> Any:
        def run(number: int, config: Config, ctx: TrialContext, repeat: int | None = None, stress: bool = False,
                **kw: Any) -> TrialResult:  # fmt: skip
            if limit is not None and len(booted) == limit:
                raise KeyboardInterrupt  # the lease ended during this boot
            booted.append((number, repeat, stress))
            return _scripted(number, config, ctx, repeat, stress, **kw)

        return run

    monkeypatch.setattr(finalists, "run_trial", boots_until(3))
    with pytest.raises(KeyboardInterrupt):
        finalists.run_finalists(study, k=3, n=2, ctx=ctx, enforce_eager=True)
    assert booted == [(0, 1, False), (0, 2, True), (1, 1, False)]
    assert list(study.user_attrs["finalist_runs"]) == ["0", "1"] and list(study.user_attrs["stress"]) == ["0"]
    monkeypatch.setattr(finalists, "run_trial", boots_until(None))
    verdict = finalists.run_finalists(study, k=3, n=2, ctx=ctx, enforce_eager=True)
    # only what had not ended boots again: trial 1's second repeat (with its check), then trials 2 and 3
    assert booted[3:] == [(1, 2, True), (2, 1, False), (2, 2, True), (3, 1, False), (3, 2, True)]
    assert {f["trial"]: f["stats"]["goodput_req_s"]["n"] for f in study.user_attrs["finalists"]} == {
        0: 2, 1: 2, 2: 2, 3: 2,
    }, "every finalist's summary reads both its repeats, those of the first run included"  # fmt: skip
    checks = study.user_attrs["stress"]
    assert checks["1"]["failure"] == "slo_collapse" and checks["3"]["failure"] == "oom_load"
    added = [t.user_attrs["stress_of"] for t in study.trials if t.user_attrs.get("config_kind") == "stress_check"]
    assert sorted(added) == [1, 3], "each failed check is one trial, however often the search resumed"
    assert verdict["stress_failed"] == [1, 3]
    # a third run finds everything done and boots nothing
    monkeypatch.setattr(finalists, "run_trial", boots_until(len(booted)))
    assert finalists.run_finalists(study, k=3, n=2, ctx=ctx, enforce_eager=True) == verdict


def test_a_two_tier_study_repeats_each_tiers_best(ctx: TrialContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--finalists k`` is per tier in a capacity-pareto study (docs/search.md, "Finalists and the
    verdict"): each tier's k best are repeated. Here the tiers disagree: trial 1 is the interactive
    tier's best, trial 3 the relaxed tier's, and trial 2 ranks second under both. Taking the first k of
    the interactive ranking left trial 3 out, so the relaxed tier's verdict was on the wrong configs."""
    study = optuna.create_study(directions=[MAX, MAX])
    study.set_user_attr("objective", "capacity-pareto")
    caps = {0: (5.0, 6.0), 1: (10.0, 5.0), 2: (8.0, 8.0), 3: (6.0, 9.0)}  # trial 0: the engine default
    for number, (interactive, relaxed) in caps.items():
        metrics = {"capacity_interactive_req_s": interactive, "capacity_relaxed_req_s": relaxed}
        config = {} if number == 0 else {"chunk_size": 512 * number}
        attrs = {"config_kind": DEFAULT_KIND if number == 0 else "sampled", "constraint_violation": 0.0,
                 "engine": "vllm", "config": config, "metrics": metrics}  # fmt: skip
        study.add_trial(optuna.trial.create_trial(values=[interactive, relaxed], user_attrs=attrs))
    booted: list[int] = []

    def run(number: int, config: Config, ctx: TrialContext, repeat: int | None = None, stress: bool = False,
            **_: Any) -> TrialResult:  # fmt: skip
        booted.append(number)
        interactive, relaxed = caps[number]
        metrics = {"capacity_interactive_req_s": interactive, "capacity_relaxed_req_s": relaxed}
        return TrialResult(config, SPEC, "0.32.0", metrics=metrics)

    monkeypatch.setattr(finalists, "run_trial", run)
    verdict = finalists.run_finalists(study, k=1, n=3, ctx=ctx, enforce_eager=True, stress=False)
    assert booted == [0, 0, 0, 1, 1, 1, 3, 3, 3], "the default first, then each tier's best; trial 2 is neither"
    assert verdict["by_metric"]["capacity_interactive_req_s"]["trials"] == [1]
    assert verdict["by_metric"]["capacity_relaxed_req_s"]["trials"] == [3]


def test_the_h100_studys_finalists_run_as_its_blocks_will_and_resume_across_a_lease(
    ctx: TrialContext, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A dry run of the H100 study's finalists stage on a copy of its file (reports/gpu-h100.md), with
    scripted runs in place of the engines: both engines' defaults first (trials 0 and 6), then the best
    of both tiers (trial 8), three fresh boots each at its recorded config, each started at its own
    capacities, the stress check on the third. Blocks 12 and 14 stored the vLLM default's three repeats
    (and the stress check; a second was withdrawn: block12/NOTES.md), blocks 15 and 16 SGLang's
    defaults' three (and the stress check) and trial 8's first; SGLang's defaults' repeats 2 and 3 were
    withdrawn in session 52 (their relaxed tier read one step of two at its claim: the RUNBOOK,
    "Retaken in session 52"), so the stage goes on from trial 6's second, whose stress check stands;
    a lease that ends after one boot leaves it stored, and the next block boots only those missing."""
    copy = tmp_path / "study.db"
    copy.write_bytes(H100_STUDY.read_bytes())
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{copy}")
    recorded = {t.number: t.user_attrs for t in study.trials}
    tiers = {"interactive": {"ttft_p95_ms": 300.0, "tpot_p95_ms": 100.0},
             "relaxed": {"ttft_p95_ms": 600.0, "tpot_p95_ms": 200.0}}  # fmt: skip
    ctx = dataclasses.replace(ctx, capacity=CapacityPlan(tiers=tiers, scored=("interactive", "relaxed")))
    booted: list[tuple[int, int | None, bool]] = []
    lease_ends_after: list[int | None] = [1]

    def run(number: int, config: Config, ctx: TrialContext, repeat: int | None = None, stress: bool = False,
            **hint: Any) -> TrialResult:  # fmt: skip
        if lease_ends_after[0] is not None and len(booted) == lease_ends_after[0]:
            raise KeyboardInterrupt("finish.sh: SIGTERM")
        attrs = recorded[number]
        assert config.engine == attrs["engine"] and dict(config.params) == attrs["config"]
        metrics = dict(attrs["metrics"])  # a repeat reports what its trial did (block 12's stored one too)
        assert hint == {"incumbents": {t: metrics[f"capacity_{t}_req_s"] for t in tiers}, "prune": False}
        booted.append((number, repeat, stress))
        result = TrialResult(config, SPEC, str(attrs["engine_version"]), metrics=metrics)
        if stress:
            result.stress = {"metrics": {"ttft_p95_ms": 900.0, "e2e_p95_ms": 9000.0, "error_rate": 0.0},
                             "alive": True, "killed": False, "log": "", "prompt_tokens": 4096, "concurrency": 48,
                             "cache_reset": True}  # fmt: skip
        return result

    monkeypatch.setattr(finalists, "run_trial", run)
    with pytest.raises(KeyboardInterrupt):
        finalists.run_finalists(study, k=1, n=3, ctx=ctx, enforce_eager=False, stress=True)
    assert booted == [(6, 2, False)]
    stored = study.user_attrs["finalist_runs"]
    assert {n: len(runs) for n, runs in stored.items()} == {"0": 3, "6": 2, "8": 1}
    assert sorted(study.user_attrs["stress"]) == ["0", "6"]
    assert [r["repeat"] for r in stored["0"]] == [1, 2, 3] and [r["repeat"] for r in stored["6"]] == [1, 2]
    assert [r["repeat"] for r in study.user_attrs["finalist_runs_withdrawn"]["6"]] == [3, 2]
    lease_ends_after[0] = None
    booted.clear()
    verdict = finalists.run_finalists(study, k=1, n=3, ctx=ctx, enforce_eager=False, stress=True)
    assert booted == [(6, 3, False), (8, 2, False), (8, 3, True)]
    assert [f["trial"] for f in study.user_attrs["finalists"]] == [0, 6, 8]
    assert sorted(study.user_attrs["stress"]) == ["0", "6", "8"] and verdict["stress_failed"] == []
    assert set(verdict["by_metric"]) == {"capacity_interactive_req_s", "capacity_relaxed_req_s"}


def test_a_repeat_keeps_its_search_and_a_withdrawn_repeat_runs_again(
    study: optuna.Study, ctx: TrialContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each repeat keeps its capacity search (without the request rows the trial keeps), so a figure
    reached on ``max_steps`` is told from one resolved; a repeat a fault of the tuner measured is
    withdrawn with its reason, kept apart, and the next run of the stage boots it again."""
    booted: list[tuple[int, int | None]] = []
    faulty = [True]  # the tuner's fault, until it is fixed

    def run(number: int, config: Config, ctx: TrialContext, repeat: int | None = None, stress: bool = False,
            **kw: Any) -> TrialResult:  # fmt: skip
        booted.append((number, repeat))
        result = _scripted(number, config, ctx, repeat, stress, **kw)
        stop = "max_steps" if (number, repeat) == (0, 2) and faulty[0] else "resolved"
        result.capacity = {"tiers": {"interactive": {"stop_reason": stop, "steps": [{"rate_req_s": 1.0}]}},
                           "measured": [{"rows": [[0.0, 0.1, 1.0]]}], "steps_measured": 1}  # fmt: skip
        return result

    monkeypatch.setattr(finalists, "run_trial", run)
    finalists._runs(study, study.trials[0], 2, ctx, True, False)  # the default's repeats, before any verdict
    runs = study.user_attrs["finalist_runs"]["0"]
    assert [r["capacity"]["tiers"]["interactive"]["stop_reason"] for r in runs] == ["resolved", "max_steps"]
    assert all("measured" not in r["capacity"] and r["capacity"]["steps_measured"] == 1 for r in runs)

    with pytest.raises(ConfigError, match="not its last stored repeat"):
        finalists.withdraw_repeat(study, 0, 1, "a fault")
    with pytest.raises(ConfigError, match="reason"):
        finalists.withdraw_repeat(study, 0, 2, " ")
    taken = finalists.withdraw_repeat(study, 0, 2, "the search halved below undecided steps (fixed)")
    assert taken["repeat"] == 2 and [r["repeat"] for r in study.user_attrs["finalist_runs"]["0"]] == [1]
    kept = study.user_attrs["finalist_runs_withdrawn"]["0"]
    assert [(r["repeat"], r["withdrawn"]) for r in kept] == [(2, "the search halved below undecided steps (fixed)")]

    faulty[0] = False
    booted.clear()
    finalists.run_finalists(study, k=1, n=2, ctx=ctx, enforce_eager=True, stress=False)
    assert booted[0] == (0, 2), "the withdrawn repeat boots again, under its own number"
    assert [r["capacity"]["tiers"]["interactive"]["stop_reason"] for r in study.user_attrs["finalist_runs"]["0"]] == [
        "resolved", "resolved",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="verdict"):
        finalists.withdraw_repeat(study, 0, 2, "too late")


def test_the_withdraw_script_takes_the_last_repeat_from_a_study_file(tmp_path: Any) -> None:
    """scripts/gpu/withdraw_repeat.py on a copy of the H100 study's file: trial 0 keeps repeats 1 to 3
    after block 14, so 3 is its last; another repeat number is refused with exit 2, and so is bad usage."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "gpu" / "withdraw_repeat.py"
    copy = tmp_path / "study.db"
    copy.write_bytes(H100_STUDY.read_bytes())
    run = [sys.executable, str(script), str(copy), "rag-h100-study-1", "0"]
    refused = subprocess.run([*run, "2", "gone already"], capture_output=True, text=True, check=False)
    assert refused.returncode == 2 and "repeat 2 is not its last stored repeat (3)" in refused.stderr
    usage = subprocess.run(run, capture_output=True, text=True, check=False)
    assert usage.returncode == 2 and "withdraw_repeat.py DB STUDY TRIAL REPEAT REASON" in usage.stderr
    done = subprocess.run([*run, "3", "a test"], capture_output=True, text=True, check=True)
    assert "trial 0: repeat 3 withdrawn (a test)" in done.stdout
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{copy}")
    assert [r["repeat"] for r in study.user_attrs["finalist_runs"]["0"]] == [1, 2]
    assert [r["repeat"] for r in study.user_attrs["finalist_runs_withdrawn"]["0"]] == [2, 3]
