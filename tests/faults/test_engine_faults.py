"""Engines that misbehave on purpose, run through the tuner's real trial path as real processes.

Each study: trial 0 is the engine default on a well-behaved boot, trial 1 meets the fault, then the
same ``tuner search`` is run again on the study, which must go on from there with nothing lost.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, exited, lost, measured, recorded_class, resumed, spawn, states
from tests.faults.outcomes import observing

# mode: (what is injected, the class trial 1 must be recorded with: None = it served)
FAULTS: dict[str, tuple[str, str | None]] = {
    "never_ready": ("/health answers 503 forever (boot deadline 10 s)", "boot_timeout"),
    "exit_boot": ("the engine exits with status 1 during boot", "engine_died"),
    "http_500": ("every completion answers HTTP 500", "request_errors"),
    "stream_cut": ("every stream stops half way, without [DONE]", "request_errors"),
    "bad_sse": ("SSE data lines that are not JSON", "request_errors"),
    "stall": ("one token, then silence on an open connection (request timeout 1.5 s)", "request_errors"),
    "slow": ("a token every 40 ms", None),
    "die_mid": ("the engine SIGKILLs itself in the middle of the workload", "crash_on_request"),
    "metrics_missing": ("/metrics answers 404", None),
    "metrics_bad": ("/metrics answers garbage", None),
}


def short_deadlines(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """For the engine that never gets ready a 10 s boot deadline polled every 0.2 s, and for the stall a
    1.5 s request timeout: the defaults (300 s, 120 s) would make the suite wait minutes for the same
    outcome. Every other boot keeps the default deadline, so a healthy fault engine slow to start on a
    busy machine is never cut short."""
    from tuner.client.driver import drive_sync
    from tuner.measure import process
    from tuner.measure import trial as serving

    if mode == "never_ready":
        wait_ready = process.ServerProcess.wait_ready
        monkeypatch.setattr(
            process.ServerProcess,
            "wait_ready",
            lambda self, deadline_s, poll_s=1.0: wait_ready(self, min(deadline_s, 10.0), 0.2),
        )
    if mode == "stall":
        monkeypatch.setattr(serving, "drive_sync", functools.partial(drive_sync, request_timeout_s=1.5))


@pytest.mark.parametrize("mode", list(FAULTS))
def test_a_misbehaving_engine_is_recorded_and_the_study_goes_on(
    mode: str, study: Study, engine: FaultEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    injected, expected = FAULTS[mode]
    monkeypatch.setenv("TUNER_FAULT", f"ok,{mode},ok")
    monkeypatch.setenv("TUNER_FAULT_SLOW_S", "0.04")
    short_deadlines(monkeypatch, mode)
    with observing(mode, injected) as row:
        code, err = study.search(2)
        row.saw(exited(code, err))
        assert code == 0 and "Traceback" not in err, err
        first = study.trials()
        if len(first) > 1:
            row.recorded = recorded_class(first[1])
            row.saw(f"trial 1's engine {engine.ended(1)}", *measured(first[1]))
        assert states(first) == [("COMPLETE", None), ("COMPLETE", expected)], err
        faulty = first[1]
        if expected is None:
            assert faulty.user_attrs["constraint_violation"] == 0 and all(map(math.isfinite, faulty.values))
        else:
            assert faulty.user_attrs["constraint_violation"] > 0 and faulty.values == [math.inf, 0.0]
        _check_mode(mode, faulty.user_attrs)
        left = procs.left_after(15.0)
        row.processes_left = len(left)
        assert not left

        boots = engine.boots()
        code, err = study.search(3)
        assert code == 0 and "Traceback" not in err, err
        after = study.trials()
        row.trials_lost, row.resumed = lost(first, after), resumed(engine, boots, first, after)
        assert row.trials_lost == 0 and row.resumed


def _check_mode(mode: str, attrs: dict[str, Any]) -> None:
    metrics = attrs["metrics"]
    assert isinstance(metrics, dict) or mode in ("never_ready", "exit_boot")
    if mode == "slow":
        assert metrics["tpot_p95_ms"] >= 35, "the slowness is measured, not hidden"
        assert metrics["n_errors"] == 0
    if mode in ("metrics_missing", "metrics_bad"):
        assert metrics["n_errors"] == 0
        assert attrs["server"] in ({}, None) or attrs["server"].get("server_ttft_mean_ms") is None
    if mode == "exit_boot":
        assert "exited during boot" in str(attrs["log_tail"])


def test_a_search_says_nothing_but_its_progress(study: Study, engine: FaultEngine, tmp_path: Path) -> None:
    proc = spawn(study.search_argv(1), tmp_path, tmp_path / "tuner.log")
    assert proc.wait(timeout=120) == 0
    assert "Warning" not in (tmp_path / "tuner.log").read_text()
