"""The tuner interrupted: SIGINT and SIGTERM during boot and during the workload, and SIGKILL, which
no handler sees (the reaper, ``tuner.measure.reaper``, must stop the engine then)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, lost, resumed, spawn, states
from tests.faults.outcomes import FaultRow, record_fault

FIRST_TRIAL_REQUESTS = 10  # the default trial: 2 warmup + 8 measured, all served by the first boot


def _interrupt(
    study: Study, engine: FaultEngine, tmp_path: Path, sig: signal.Signals, during: str
) -> tuple[int | None, str]:
    """Run a 2-trial search as its own process and send ``sig`` while trial 1 is in ``during``."""
    proc = spawn(study.search_argv(2), tmp_path, tmp_path / "tuner.log")
    try:
        engine.wait_for("boot", count=2)
        if during == "workload":
            engine.wait_for("request", count=FIRST_TRIAL_REQUESTS + 3)
        time.sleep(0.3)
        proc.send_signal(sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return code, (tmp_path / "tuner.log").read_text()


@pytest.mark.parametrize("during", ["boot", "workload"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_tuner_interrupted_stops_the_engine_and_resumes(
    sig: signal.Signals, during: str, study: Study, engine: FaultEngine, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("TUNER_FAULT", "ok,never_ready,ok" if during == "boot" else "ok,slow,ok")
    monkeypatch.setenv("TUNER_FAULT_SLOW_S", "0.2")  # trial 1's workload takes ~20 s: time to interrupt it
    code, log = _interrupt(study, engine, tmp_path, sig, during)
    assert code == 130, log
    assert "tuner: interrupted" in log and "Traceback" not in log, log
    left = procs.left_after(15.0)
    assert not left
    before = study.trials()
    assert states(before) == [("COMPLETE", None), ("FAIL", None)]

    monkeypatch.setenv("TUNER_FAULT", "ok")
    boots = engine.boots()
    code, err = study.search(2)
    assert code == 0, err
    after = study.trials()
    trials_lost = lost(before, after)
    assert trials_lost == 0 and resumed(engine, boots, before, after)
    name = f"{sig.name}-during-{during}"
    record_fault(FaultRow(name, f"{sig.name} to the tuner while trial 1 was in its {during}",
                          "stopped the engine's group, marked the trial FAIL, exited 130 with one line",
                          "FAIL (interrupted)", len(left), trials_lost, True))  # fmt: skip


def test_the_tuner_sigkilled_takes_its_engine_with_it(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_FAULT", "ok,slow,ok")
    monkeypatch.setenv("TUNER_FAULT_SLOW_S", "0.2")
    code, log = _interrupt(study, engine, tmp_path, signal.SIGKILL, "workload")
    assert code == -signal.SIGKILL
    left = procs.left_after(15.0)  # the reaper's SIGTERM, or SIGKILL after its 10 s grace
    assert not left
    assert "term" in engine.events()[-1], "the engine was stopped with SIGTERM, not left to the OOM killer"
    before = study.trials()
    assert states(before) == [("COMPLETE", None), ("RUNNING", None)], "a SIGKILL leaves its trial RUNNING"

    monkeypatch.setenv("TUNER_FAULT", "ok")
    code, err = study.search(2)
    assert code == 0, err
    after = study.trials()
    trials_lost = lost(before, after)
    assert trials_lost == 0 and after[1].state.name == "FAIL", "the dead run's trial is reclaimed"
    retried = [t for t in after[2:] if t.params == before[1].params]
    assert retried and retried[0].state.name == "COMPLETE", "and its config measured after all"
    record_fault(FaultRow("SIGKILL-tuner", "SIGKILL to the tuner while trial 1 was in its workload",
                          "its reaper (parent-death signal) stopped the engine's group; the next search "
                          "marked the trial FAIL and ran its config again", "RUNNING, then FAIL and retried",
                          len(left), trials_lost, True))  # fmt: skip


def test_an_interrupted_engine_default_trial_is_measured_on_resume(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_FAULT", "never_ready,ok")
    proc = spawn(study.search_argv(2), tmp_path, tmp_path / "tuner.log")
    engine.wait_for("boot")
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    monkeypatch.setenv("TUNER_FAULT", "ok")
    assert study.search(2)[0] == 0
    defaults = [t for t in study.trials() if t.user_attrs.get("config_kind") == "engine_default"]
    assert [t.state.name for t in defaults][-1] == "COMPLETE", "the baseline every winner is compared with"
