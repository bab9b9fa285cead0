"""The fleet protocol's pieces on real SQLite files (PostgreSQL and real workers: tests/fleet)."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path

import optuna
import pytest

from tuner.errors import ConfigError
from tuner.fleet.loop import Reservation, boots_used, reclaim, sole_process
from tuner.search.worker import fill_from_study
from tuner.study.attrs import bind_study_attrs


def test_the_reservation_lets_one_sampler_in_at_a_time(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    inside, most = [0], [0]

    def sample() -> None:
        with Reservation(url, "s").held():
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            time.sleep(0.05)
            inside[0] -= 1

    threads = [threading.Thread(target=sample) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1


def test_a_second_run_of_a_sqlite_study_is_refused_naming_postgresql(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with sole_process(url, "s"), pytest.raises(ConfigError, match="PostgreSQL"), sole_process(url, "s"):
        pass
    with sole_process(url, "s"):  # released once the first run ends
        pass


def test_trials_left_running_by_a_dead_run_are_failed_and_queued_again(tmp_path: Path) -> None:
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    lost = study.ask()
    lost.suggest_int("x", 0, 9)
    lost.set_user_attr("booted", True)
    assert boots_used(study) == 1, "a running trial holds its place in the budget"
    assert reclaim(study) == 1
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.FAIL, optuna.trial.TrialState.WAITING]
    retry = study.trials[1]
    assert retry.params == lost.params and retry.system_attrs["failed_trial"] == 0
    assert boots_used(study) == 0, "a FAIL is redone, not counted"


def test_a_study_refuses_trials_from_other_hardware() -> None:
    study = optuna.create_study(directions=["minimize", "maximize"])
    h200 = {"kind": "cuda", "name": "NVIDIA H200", "memory_bytes": 150754820096}
    attrs = {"workload_digest": "d" * 64, "hardware": h200, "engines": {"vllm": {"version": "0.26.0"}}}
    bind_study_attrs(study, attrs)
    bind_study_attrs(study, attrs)  # the same machine again: fine
    h100 = {**attrs, "hardware": {"kind": "cuda", "name": "NVIDIA H100", "memory_bytes": 85 * 2**30}}
    with pytest.raises(ConfigError, match="was made on NVIDIA H200"):
        bind_study_attrs(study, h100)
    with pytest.raises(ConfigError, match="engines"):
        bind_study_attrs(study, {**attrs, "engines": {"vllm": {"version": "0.32.0"}}})


def test_a_worker_on_sqlite_is_refused_naming_postgresql() -> None:
    args = argparse.Namespace(storage="sqlite:///studies/x.db", study="x")
    with pytest.raises(ConfigError, match="postgresql://"):
        fill_from_study(args)


def test_gpus_on_a_cpu_build_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    db = tmp_path / "s.db"
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "search", "--workload", "rag", "--gpus", "0,1", "--storage", f"sqlite:///{db}"],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("tuner: --gpus needs NVIDIA GPUs")
    assert not db.exists(), "nothing written"
