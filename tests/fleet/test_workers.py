"""A fleet for real: three `tuner worker` processes on one PostgreSQL study, real vLLM CPU engines.

One study of 4 booted trials is shared by the tests of this module. While the workers run, one of
them is SIGKILLed in the middle of its trial: its engine must die with it, its trial must be marked
FAIL once its heartbeat is stale and be run again by another worker, and the study must still end
with exactly 4 completed trials, numbered once each, every one carrying the worker that ran it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import optuna
import psutil
import pytest

from tests.e2e.conftest import ROOT, engine_processes, tuner

pytestmark = pytest.mark.engine(boots=5)  # 4 trials and the one killed mid-trial
BUDGET = 4  # three workers, one killed mid-trial: its trial runs again and the other two share the rest
SPACE = "engines: [vllm]\nparameters:\n  chunk_size: {choices: [512, 1024, 2048]}\n  max_num_seqs: {choices: [2, 4]}\n"
FAST_HEARTBEAT = {"TUNER_HEARTBEAT_S": "2", "TUNER_HEARTBEAT_GRACE_S": "12"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    url = os.environ.get("TUNER_TEST_POSTGRES")
    if not url:
        pytest.skip("TUNER_TEST_POSTGRES is not set: run scripts/test.sh for a real PostgreSQL")
    tmp = tmp_path_factory.mktemp("fleet")
    (tmp / "space.yaml").write_text(SPACE)
    name = f"fleet-{uuid.uuid4().hex[:8]}"
    made = tuner("search", "--workload", "rag", "--study", name, "--storage", url, "--space", str(tmp / "space.yaml"),
                 "--requests", "6", "--trials", "0", "--repeats", "0", "--no-stress",
                 "--objective", "pareto")  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    workers = [_start_worker(name, url, tmp / f"worker{i}.log") for i in range(3)]
    victim, killed_trial = _kill_one_mid_trial(workers, name, url)
    for w in workers:
        if w is not victim:
            assert w.wait(timeout=900) == 0, (tmp / "worker0.log").read_text()[-3000:]
    return {"study": optuna.load_study(study_name=name, storage=url), "victim": victim, "killed": killed_trial}


def _start_worker(name: str, url: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "worker", "--study", name, "--storage", url, "--trials", str(BUDGET)],
        cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **FAST_HEARTBEAT},
    )  # fmt: skip


def _kill_one_mid_trial(
    workers: list[subprocess.Popen[bytes]], name: str, url: str
) -> tuple[subprocess.Popen[bytes], int]:
    """SIGKILL the first worker seen driving a workload; return it and its trial's number."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        study = optuna.load_study(study_name=name, storage=url)
        for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):
            owner = next((w for w in workers if w.pid == (t.user_attrs.get("worker") or {}).get("pid")), None)
            if owner is not None and _engine_children(owner.pid):
                time.sleep(3)  # well inside the trial: booting or driving
                owner.send_signal(signal.SIGKILL)
                owner.wait(timeout=30)
                return owner, t.number
        time.sleep(1)
    raise AssertionError("no worker was seen running a trial")


def _engine_children(pid: int) -> list[psutil.Process]:
    try:
        return [p for p in psutil.Process(pid).children(recursive=True) if "api_server" in " ".join(p.cmdline())]
    except psutil.Error:
        return []


def test_the_study_ends_with_exactly_its_budget_of_completed_trials(fleet: dict[str, object]) -> None:
    study: optuna.Study = fleet["study"]  # type: ignore[assignment]
    complete = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len([t for t in complete if t.user_attrs.get("booted")]) == BUDGET
    numbers = [t.number for t in study.trials]
    assert len(numbers) == len(set(numbers)), "no trial number twice"
    assert not study.get_trials(states=(optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING))


def test_every_trial_carries_its_worker_and_the_work_was_shared(fleet: dict[str, object]) -> None:
    study: optuna.Study = fleet["study"]  # type: ignore[assignment]
    booted = [t for t in study.trials if t.user_attrs.get("booted")]
    for t in booted:
        worker = t.user_attrs["worker"]
        assert worker["host"] and worker["pid"] > 0 and worker["gpus"] is None
    assert len({t.user_attrs["worker"]["pid"] for t in booted}) >= 2


def test_the_killed_workers_trial_is_failed_and_run_again(fleet: dict[str, object]) -> None:
    study: optuna.Study = fleet["study"]  # type: ignore[assignment]
    killed = study.trials[fleet["killed"]]  # type: ignore[index]
    assert killed.state == optuna.trial.TrialState.FAIL
    retries = [t for t in study.trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retries) == 1 and retries[0].state == optuna.trial.TrialState.COMPLETE
    assert retries[0].params == killed.params
    victim: subprocess.Popen[bytes] = fleet["victim"]  # type: ignore[assignment]
    assert retries[0].user_attrs["worker"]["pid"] != victim.pid


def test_no_engine_outlives_its_killed_worker(fleet: dict[str, object]) -> None:
    assert engine_processes() == []
