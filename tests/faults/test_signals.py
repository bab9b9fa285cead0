"""The tuner interrupted: SIGINT and SIGTERM during boot and during the workload, and SIGKILL, which
no handler sees (the reaper, ``tuner.measure.reaper``, must stop the engine then)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, exited, lost, reclaimed, recorded_class, resumed, spawn, states
from tests.faults.outcomes import observing

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
    with observing(f"{sig.name}-during-{during}", f"{sig.name} to the tuner while trial 1 was in its {during}") as row:
        code, log = _interrupt(study, engine, tmp_path, sig, during)
        row.saw(exited(code, log, "the tuner"), f"trial 1's engine {engine.ended(1)}")
        assert code == 130, log
        assert "tuner: interrupted" in log and "Traceback" not in log, log
        left = procs.left_after(15.0)
        row.processes_left = len(left)
        assert not left
        before = study.trials()
        row.recorded = ", ".join(recorded_class(t) for t in before[1:]) or "no trial 1"
        assert states(before) == [("COMPLETE", None), ("FAIL", None)]

        monkeypatch.setenv("TUNER_FAULT", "ok")
        boots = engine.boots()
        code, err = study.search(2)
        assert code == 0, err
        after = study.trials()
        row.trials_lost, row.resumed = lost(before, after), resumed(engine, boots, before, after)
        assert row.trials_lost == 0 and row.resumed


def test_the_tuner_sigkilled_takes_its_engine_with_it(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_FAULT", "ok,slow,ok")
    monkeypatch.setenv("TUNER_FAULT_SLOW_S", "0.2")
    with observing("SIGKILL-tuner", "SIGKILL to the tuner while trial 1 was in its workload") as row:
        code, log = _interrupt(study, engine, tmp_path, signal.SIGKILL, "workload")
        row.saw(exited(code, log, "the tuner"))
        assert code == -signal.SIGKILL
        left = procs.left_after(15.0)  # the reaper's SIGTERM, or SIGKILL after its 10 s grace
        row.processes_left = len(left)
        row.saw(f"trial 1's engine {engine.ended(1)} after the tuner was gone")
        assert not left
        assert "term" in engine.events()[-1], "the engine was stopped with SIGTERM, not left to the OOM killer"
        before = study.trials()
        row.recorded = reclaimed(before, [])  # trial 1 as the SIGKILL left it; the next search's "then" below
        assert states(before) == [("COMPLETE", None), ("RUNNING", None)], "a SIGKILL leaves its trial RUNNING"

        monkeypatch.setenv("TUNER_FAULT", "ok")
        boots = engine.boots()
        code, err = study.search(2)
        assert code == 0, err
        after = study.trials()
        retried = [t for t in after[2:] if t.params == before[1].params]
        row.recorded = reclaimed(before, after)
        row.saw(f"the next search measured trial 1's config again: {recorded_class(retried[0])}" if retried
                else "the next search did not measure trial 1's config again")  # fmt: skip
        row.trials_lost, row.resumed = lost(before, after), resumed(engine, boots, before, after)
        assert row.trials_lost == 0 and after[1].state.name == "FAIL", "the dead run's trial is reclaimed"
        assert retried and retried[0].state.name == "COMPLETE", "and its config measured after all"
        assert row.resumed, "and the search went on"


def test_an_interrupted_engine_default_trial_is_measured_on_resume(
    study: Study, engine: FaultEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNER_FAULT", "never_ready,ok")
    proc = spawn(study.search_argv(2), tmp_path, tmp_path / "tuner.log")
    engine.wait_for("boot")
    time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    # once under heavy load the tuner died of the signal (-2) instead: the log says where it was
    assert proc.wait(timeout=60) == 130, (tmp_path / "tuner.log").read_text()[-3000:]
    monkeypatch.setenv("TUNER_FAULT", "ok")
    assert study.search(2)[0] == 0
    defaults = [t for t in study.trials() if t.user_attrs.get("config_kind") == "engine_default"]
    assert [t.state.name for t in defaults][-1] == "COMPLETE", "the baseline every winner is compared with"
