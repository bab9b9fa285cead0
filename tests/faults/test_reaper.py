"""``tuner.measure.reaper`` under ``ServerProcess``: the engine's exit status reads as before, and an engine
outlives neither a SIGKILLed tuner nor its own SIGTERM handler (one that ignores it).

No fixed sleeps: each test waits for the state it needs (``_until``, a generous deadline that a loaded
machine still meets), and a time is only ever bounded from below by what the code must wait for, or
from above by far less than the stand-in's own 600 s sleep."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import ROOT
from tuner.engines.base import LaunchSpec
from tuner.measure.process import ServerProcess

STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "os.fork() == 0 and os.setsid(); time.sleep(600)  # fault_engine stand-in")  # fmt: skip


DEADLINE_S = 60.0  # for a process to start, exit or be reaped, however busy the machine


def _until(done: Callable[[], bool], what: str, timeout_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s:.0f} s: {what}"
        time.sleep(0.05)


def _spec(code: str, folder: Path) -> LaunchSpec:
    """An engine stand-in: ``code`` run as a module whose name ``procs`` knows (it ignores its address)."""
    (folder / "fault_engine_stand_in.py").write_text(code)
    return LaunchSpec(engine="vllm", python=sys.executable, module="fault_engine_stand_in", args=(),
                      host="127.0.0.1", port=1, env={"PYTHONPATH": str(folder)}, health_path="/health",
                      served_model="m")  # fmt: skip


@pytest.mark.parametrize(
    ("code", "status"),
    [("import sys; sys.exit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)],
)
def test_the_engine_exit_status_is_the_reapers(tmp_path: Path, code: str, status: int) -> None:
    with ServerProcess(_spec(code, tmp_path), tmp_path / "engine.log") as server:
        _until(lambda: not server.alive(), "the engine exits")
        assert server.returncode() == status


def test_an_engine_that_cannot_start_says_why_in_its_log(tmp_path: Path) -> None:
    spec = LaunchSpec(engine="vllm", python="/nonexistent/python", module="x", args=(), host="127.0.0.1", port=1,
                      health_path="/health", served_model="m")  # fmt: skip
    with ServerProcess(spec, tmp_path / "engine.log") as server:
        _until(lambda: server.returncode() is not None, "the reaper reports the failed start")
        assert server.returncode() == 127
    assert "cannot start" in (tmp_path / "engine.log").read_text()


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tuner.measure.process.STOP_GRACE_S", 2.0)
    with ServerProcess(_spec(STUBBORN, tmp_path), tmp_path / "engine.log"):
        _until(lambda: len(procs.started()) == 3, "reaper, engine and the worker that left its session")
        stopping = time.monotonic()
    stopped_s = time.monotonic() - stopping
    assert not procs.started()
    assert 2.0 <= stopped_s < DEADLINE_S, "SIGTERM ignored for the whole grace, then killed, not left to sleep"


def test_a_sigkilled_tuner_takes_even_a_stubborn_engine_with_it(tmp_path: Path) -> None:
    spec = _spec(STUBBORN, tmp_path)
    script = ("import sys, time; from pathlib import Path; from tuner.engines.base import LaunchSpec; "
              "import tuner.measure.process; from tuner.measure.process import ServerProcess; "
              "tuner.measure.process.STOP_GRACE_S = 2.0\n"
              f"spec = LaunchSpec(engine='vllm', python=sys.executable, module='fault_engine_stand_in', args=(), "
              f"host='127.0.0.1', port=1, env={dict(spec.env)!r}, health_path='/h', served_model='m')\n"
              f"with ServerProcess(spec, Path({str(tmp_path / 'engine.log')!r})):\n"
              "    print('up', flush=True); time.sleep(600)\n")  # fmt: skip
    tuner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    assert tuner.stdout is not None and tuner.stdout.readline() == b"up\n"
    _until(lambda: len([p for p in procs.started() if p.pid != tuner.pid]) == 3, "reaper, engine and worker")
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    left = procs.left_after(DEADLINE_S)  # SIGTERM (ignored), the 2 s grace, then SIGKILL to the group and tree
    assert not left
