"""What each trial cost: boot, measuring and the tuner's own time from a trial's phases and wall time."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import optuna

from tuner.report.html import summary_md, write_report
from tuner.report.trial_costs import costs_md, trial_cost

GIB = 1024**3
START = dt.datetime(2026, 12, 5, 21, 43, 31)


def _trial(
    number: int, wall_s: float, state: optuna.trial.TrialState, attrs: dict[str, object]
) -> optuna.trial.FrozenTrial:
    return optuna.trial.FrozenTrial(
        number=number, state=state, value=1.0 if state == optuna.trial.TrialState.COMPLETE else None,
        datetime_start=START, datetime_complete=START + dt.timedelta(seconds=wall_s),
        params={"engine": attrs["engine"]},
        distributions={"engine": optuna.distributions.CategoricalDistribution(["vllm", "sglang"])},
        user_attrs=attrs, system_attrs={}, intermediate_values={}, trial_id=number,
    )  # fmt: skip


def _study(tmp_path: Path) -> optuna.Study:
    """Trial 2 of the H100 study (block 3) and its SGLang defaults cut by a lease's end (block 1)."""
    study = optuna.create_study(study_name="costs", storage=f"sqlite:///{tmp_path / 'c.db'}", direction="maximize")
    study.set_user_attr("objective", "capacity")
    study.add_trial(_trial(0, 583.0, optuna.trial.TrialState.COMPLETE, {
        "engine": "vllm", "booted": True, "phases_s": {"boot": 216.11, "warmup": 6.75, "capacity": 355.67},
        "engine_gpu_peak_bytes": int(73.3 * GIB), "peak_memory_bytes": int(73.8 * GIB),
        "speculation": {"acceptance_rate": 0.8438, "mean_accept_len": 3.53},
    }))  # fmt: skip
    study.add_trial(_trial(1, 668.0, optuna.trial.TrialState.FAIL, {"engine": "sglang", "booted": True}))
    # a finalist's failed stress check, recorded as a trial of its own: never booted, not a cost
    study.add_trial(_trial(2, 0.0, optuna.trial.TrialState.COMPLETE, {"engine": "vllm", "config_kind": "stress_check"}))
    study.enqueue_trial({"engine": "sglang"})
    return study


def test_a_trials_time_splits_into_boot_measuring_and_the_tuners_own(tmp_path: Path) -> None:
    study = _study(tmp_path)
    done, cut = (trial_cost(t) for t in study.get_trials()[:2])
    assert (done.boot_s, done.wall_s) == (216.11, 583.0)
    assert done.measure_s is not None and abs(done.measure_s - (6.75 + 355.67)) < 1e-9
    assert done.tuner_s is not None and abs(done.tuner_s - (583.0 - 216.11 - 6.75 - 355.67)) < 1e-9
    assert done.peak_gib is not None and abs(done.peak_gib - 73.3) < 0.01, "the engine's own peak, not the device's"
    assert done.acceptance == "84% x3.53"
    # cut before it stored its phases: its wall time is known, nothing else
    assert (cut.status, cut.booted, cut.boot_s, cut.measure_s, cut.tuner_s, cut.wall_s) == (
        "fail",
        True,
        None,
        None,
        None,
        668.0,
    )


def test_the_report_and_summary_show_each_finished_trials_cost_and_the_total(tmp_path: Path) -> None:
    study = _study(tmp_path)
    lines = costs_md(study)
    assert "| 0 | vllm | complete | 84% x3.53 | 216 | 362 | 4 | 583 | 73.3 |" in lines
    assert "| 1 | sglang | fail | - | - | - | - | 668 | - |" in lines
    assert (
        lines[-1] == "2 finished trials, 2 booted: 1251 s in all, 216 s booting, 362 s measuring, 4 s the tuner's own."
    )
    assert not any(line.startswith(("| 2 |", "| 3 |")) for line in lines), "a stress check's record, a waiting trial"
    assert "## What each trial cost" in summary_md(study)
    page = write_report(study, tmp_path / "reports").read_text()
    assert '<section id="trial-costs"><h2>What each trial cost</h2>' in page and "<td>583</td>" in page
