"""Faults on the real vLLM CPU build, in one study of three boots. A config distinct from the engine
default is queued before it, so no trial is a twin told without a boot:

* trial 0: its API server is SIGKILLed in the middle of the measured workload; the trial must be
  recorded as ``crash_on_request`` and the study go on: trial 1 boots, with the crashed server's
  workers gone, and serves;
* during trial 1's workload (the engine default) the tuner itself is SIGKILLed: its reaper must stop
  vLLM and its EngineCore worker, which no handler of the tuner's could do;
* the same ``tuner search`` then resumes: trial 0 is kept, trial 1 is failed and the engine default
  queued again and measured: the baseline survives a SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import optuna
import psutil
import pytest

from tests.benchmarks.stamp import engine_version
from tests.faults import procs
from tests.faults.harness import (
    ROOT,
    SPACE,
    Study,
    exited,
    lost,
    measured,
    reclaimed,
    recorded_class,
    run_cli,
    spawn,
    states,
)
from tests.faults.outcomes import FaultRow, observing
from tuner.search.scoring import DIRECTIONS

pytestmark = pytest.mark.engine(boots=3)
API_SERVER = "vllm.entrypoints.openai.api_server"


def _wait_served(trial_log: Path, n: int, proc: subprocess.Popen[bytes]) -> None:
    """Until vLLM's access log shows ``n`` completions begun: 2 warmup ones, then the measured ones."""
    deadline = time.monotonic() + 400
    while not trial_log.exists() or trial_log.read_text(errors="replace").count("POST /v1/completions") < n:
        assert proc.poll() is None and time.monotonic() < deadline, f"{trial_log}: not {n} requests"
        time.sleep(0.1)


def _api_server() -> psutil.Process:
    found = [
        p for p in procs.started() if API_SERVER in " ".join(p.cmdline()) and "tuner.measure.reaper" not in p.cmdline()
    ]
    assert len(found) == 1, found
    return found[0]


def test_vllm_sigkilled_mid_workload_and_the_tuner_sigkilled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    vllm_env = (Path(os.environ.get("TUNER_ENGINES_DIR", ROOT / ".engines")) / "vllm").absolute()
    monkeypatch.chdir(tmp_path)  # studies/logs of both runs go to the test's folder
    (tmp_path / "space.yaml").write_text(SPACE)
    storage = f"sqlite:///{tmp_path / 'real.db'}"
    flags = ["--workload", "rag", "--space", str(tmp_path / "space.yaml"), "--study", "real", "--storage", storage,
             "--requests", "16", "--finalists", "0", "--repeats", "0", "--no-stress", "--no-prune",
             "--seed", "3", "--engine-env", f"vllm={vllm_env}", "--objective", "pareto"]  # fmt: skip
    study = Study("real", storage, flags)
    queued = optuna.create_study(study_name="real", storage=storage, directions=DIRECTIONS)
    params = {"engine": "vllm", "vllm.chunk_size": 1024, "vllm.max_num_seqs": 4}
    queued.enqueue_trial(params, user_attrs={"config_kind": "sampled"})
    build = f"vLLM CPU {engine_version('vllm') or 'absent'}"
    with (
        observing("SIGKILL-engine-mid-workload", "SIGKILL to vLLM's API server 6 requests into trial 0's "
                  "measured workload", build) as crash,
        observing("SIGKILL-tuner-real-engine", "SIGKILL to the tuner 6 requests into trial 1's workload",
                  build) as kill,
    ):  # fmt: skip
        _crash_then_kill(study, flags, tmp_path, crash, kill)


def _crash_then_kill(study: Study, flags: list[str], tmp_path: Path, crash: FaultRow, kill: FaultRow) -> None:
    log = tmp_path / "tuner.log"
    proc = spawn(study.search_argv(2), tmp_path, log)
    try:
        logs = tmp_path / "studies" / "logs" / "real"
        _wait_served(logs / "trial-0000-vllm.log", 2 + 6, proc)  # 6 of the 16 measured requests under way
        engine = _api_server()
        workers = engine.children(recursive=True)
        engine.send_signal(signal.SIGKILL)
        _wait_served(logs / "trial-0001-vllm.log", 2 + 6, proc)  # the study went on: trial 1 booted and serves
        alive = [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
        crash.processes_left = len(alive)  # the crashed server's workers, once the tuner went on to trial 1
        crash.saw(f"{len(workers) - len(alive)} of the server's {len(workers)} workers gone during trial 1")
        assert not alive, "workers cleared"
        vllm = [_api_server(), *_api_server().children(recursive=True)]
        assert any("EngineCore" in " ".join(p.cmdline()) or "VLLM" in p.name() for p in vllm[1:]), vllm
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    kill.saw(exited(proc.returncode, "", "the tuner"))
    left = procs.left_after(25.0)  # vLLM's own shutdown on SIGTERM, or SIGKILL after the 10 s grace
    kill.processes_left = len(left)
    kill.saw(f"of the {len(vllm)} vLLM processes then running (server, EngineCore) {sum(p in vllm for p in left)} left")
    assert not left, [p.cmdline()[:4] for p in left]
    before = study.trials()
    kill.recorded = reclaimed(before, [], 1)  # trial 1 as the SIGKILL left it; the next search's "then" below
    if before:
        crash.recorded = recorded_class(before[0])
        crash.saw(*measured(before[0]))
    assert states(before) == [("COMPLETE", "crash_on_request"), ("RUNNING", None)]
    assert before[0].user_attrs["constraint_violation"] > 0

    code, err = run_cli(["search", *flags, "--trials", "2"])
    assert code == 0, err[-3000:]
    after = study.trials()
    new = after[len(before) :]
    kill.recorded = reclaimed(before, after, 1)
    kill.saw(f"the next search measured the engine default again: {', '.join(recorded_class(t) for t in new)}")
    crash.trials_lost = kill.trials_lost = lost(before, after)
    # the search went on after both faults: it served a new trial, and booted for it (the engine default
    # is never a twin told without a boot)
    crash.resumed = kill.resumed = states(new) == [("COMPLETE", None)]
    assert kill.trials_lost == 0 and after[1].state.name == "FAIL"
    assert states(new) == [("COMPLETE", None)] and new[0].user_attrs["config_kind"] == "engine_default"
    assert new[0].params == before[1].params == {"engine": "vllm"}
