"""``tuner.measure.reaper`` under ``ServerProcess``: the engine's exit status reads as before, and an engine
outlives neither a SIGKILLed tuner nor its own SIGTERM handler (one that ignores it)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import ROOT
from tuner.engines.base import LaunchSpec
from tuner.measure.process import ServerProcess

STUBBORN = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "os.fork() == 0 and os.setsid(); time.sleep(600)  # fault_engine stand-in")  # fmt: skip


def _spec(code: str) -> LaunchSpec:
    return LaunchSpec("vllm", (sys.executable, "-c", code), {}, 1, "/health", "m")


@pytest.mark.parametrize(
    ("code", "status"),
    [("import sys; sys.exit(3)", 3), ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -9)],
)
def test_the_engine_exit_status_is_the_reapers(tmp_path: Path, code: str, status: int) -> None:
    with ServerProcess(_spec(code), tmp_path / "engine.log") as server:
        deadline = time.monotonic() + 10
        while server.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server.alive() and server.returncode() == status


def test_an_engine_that_cannot_start_says_why_in_its_log(tmp_path: Path) -> None:
    spec = LaunchSpec("vllm", ("/nonexistent/python", "-m", "x"), {}, 1, "/health", "m")
    with ServerProcess(spec, tmp_path / "engine.log") as server:
        time.sleep(0.5)
        assert server.returncode() == 127
    assert "cannot start" in (tmp_path / "engine.log").read_text()


def test_an_engine_that_ignores_sigterm_is_killed_after_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tuner.measure.process.STOP_GRACE_S", 2.0)
    started = time.monotonic()
    with ServerProcess(_spec(STUBBORN), tmp_path / "engine.log"):
        time.sleep(1.0)
        assert len(procs.started()) == 3, "reaper, engine and the worker that left its session"
    assert not procs.started() and time.monotonic() - started < 8


def test_a_sigkilled_tuner_takes_even_a_stubborn_engine_with_it(tmp_path: Path) -> None:
    script = ("import sys, time; from pathlib import Path; from tuner.engines.base import LaunchSpec; "
              "import tuner.measure.process; from tuner.measure.process import ServerProcess; "
              "tuner.measure.process.STOP_GRACE_S = 2.0\n"
              f"with ServerProcess(LaunchSpec('vllm', (sys.executable, '-c', {STUBBORN!r}), {{}}, 1, '/h', 'm'), "
              f"Path({str(tmp_path / 'engine.log')!r})):\n    print('up', flush=True); time.sleep(600)\n")  # fmt: skip
    tuner = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE)
    assert tuner.stdout is not None and tuner.stdout.readline() == b"up\n"
    time.sleep(1.0)
    assert len([p for p in procs.started() if p.pid != tuner.pid]) == 3
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    left = procs.left_after(8.0)  # SIGTERM (ignored), the 2 s grace, then SIGKILL to the group and the tree
    assert not left
