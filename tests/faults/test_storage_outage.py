"""The study's PostgreSQL stopped in the middle of a study, then started again: within the storage's
patience the tuner waits and goes on; beyond it, it stops with one line and the next search resumes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import (
    FaultEngine,
    Study,
    exited,
    lost,
    make_study,
    reclaimed,
    recorded_class,
    resumed,
    states,
)
from tests.faults.outcomes import observing
from tests.faults.pg import Postgres

pytestmark = pytest.mark.postgres  # without initdb these fail, unless TUNER_SKIP_TIERS leaves them out
FIRST_TRIAL_REQUESTS = 10


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    server = Postgres()
    yield server
    server.remove()


@pytest.fixture
def pg_study(tmp_path: Path, tiny_model: Path, engine: FaultEngine, postgres: Postgres) -> Study:
    return make_study(tmp_path, tiny_model, engine, storage=postgres.url)


def _outage(engine: FaultEngine, postgres: Postgres, restart: threading.Event) -> threading.Thread:
    """Stop the database once trial 1's workload runs; start it again when ``restart`` is set."""

    def run() -> None:
        engine.wait_for("request", count=FIRST_TRIAL_REQUESTS + 1)
        postgres.stop()
        restart.wait()
        postgres.start()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_short_outage_is_waited_out(
    pg_study: Study, engine: FaultEngine, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Down from trial 1's workload until 3 s after its engine stopped, so the trial's results meet
    the outage when they are stored: they are retried until the database is back."""
    monkeypatch.setenv("TUNER_FAULT", "ok,slow")
    monkeypatch.setenv("TUNER_FAULT_SLOW_S", "0.02")
    injected = "PostgreSQL stopped during trial 1's workload, started again 3 s after its engine stopped"
    with observing("storage-outage-short", injected) as row:
        restart = threading.Event()
        controller = _outage(engine, postgres, restart)
        restarted: list[float] = []

        def restart_later() -> None:
            engine.wait_for("term", count=2)  # trial 1's engine stopped: its results are being stored now
            time.sleep(3)
            restarted.append(time.monotonic())
            restart.set()

        threading.Thread(target=restart_later, daemon=True).start()
        code, err = pg_study.search(2)
        finished = time.monotonic()
        controller.join(timeout=30)
        row.saw(exited(code, err), _waited(restarted, finished))
        assert code == 0 and "Traceback" not in err, err
        trials = pg_study.trials()
        row.recorded = ", ".join(recorded_class(t) for t in trials[1:]) or "no trial 1"
        row.saw(f"stored {len(trials)} trials: {', '.join(s for s, _ in states(trials))}")
        assert states(trials) == [("COMPLETE", None), ("COMPLETE", None)], "nothing lost"
        assert restarted and finished > restarted[0], "the search waited for the database to come back"
        left = procs.left_after(10.0)
        row.processes_left = len(left)
        assert not left
        before, boots = pg_study.trials(), engine.boots()
        code, err = pg_study.search(3)
        assert code == 0, err
        after = pg_study.trials()
        row.trials_lost, row.resumed = lost(before, after), resumed(engine, boots, before, after)
        assert row.trials_lost == 0 and row.resumed


def _waited(restarted: list[float], finished: float) -> str:
    if not restarted:
        return "finished before the database was started again"
    return f"finished {finished - restarted[0]:.1f} s after the database was started again"


def test_an_outage_beyond_patience_stops_the_search_with_one_line(
    pg_study: Study, engine: FaultEngine, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tuner.study.storage.PATIENCE_S", 3.0)
    monkeypatch.setattr("tuner.fleet.loop.GRACE_S", 3, raising=False)  # the dead trial is found stale sooner
    monkeypatch.setenv("TUNER_FAULT", "ok,slow")
    monkeypatch.setenv("TUNER_FAULT_SLOW_S", "0.02")
    injected = ("PostgreSQL stopped during trial 1's workload and kept down past the storage's patience "
                "(3 s in the test, 300 s by default)")  # fmt: skip
    with observing("storage-outage-long", injected) as row:
        restart = threading.Event()
        controller = _outage(engine, postgres, restart)
        code, err = pg_study.search(2)
        row.saw(exited(code, err))
        assert code == 1 and "Traceback" not in err, err
        last = err.splitlines()[-1]
        assert last.startswith(f"tuner: the study storage postgresql+psycopg2://tuner@127.0.0.1:{postgres.port}/tuner "
                               "was unreachable for "), err  # fmt: skip
        assert "rerun the command to resume" in last
        left = procs.left_after(10.0)
        row.processes_left = len(left)
        row.saw(f"trial 1's engine {engine.ended(1)}")
        assert not left, "the engine was stopped"
        assert "term" in engine.events()[-1]
        restart.set()
        controller.join(timeout=30)
        before = pg_study.trials()
        row.recorded = reclaimed(before, [])  # trial 1 as the outage left it; the next search's "then" below
        assert states(before)[0] == ("COMPLETE", None), "the finished trial was kept"

        monkeypatch.setenv("TUNER_FAULT", "ok")
        boots = engine.boots()
        code, err = pg_study.search(2)
        assert code == 0, err
        after = pg_study.trials()
        row.recorded = reclaimed(before, after)
        row.trials_lost, row.resumed = lost(before, after), resumed(engine, boots, before, after)
        assert row.trials_lost == 0 and after[1].state.name == "FAIL", (
            "the interrupted trial is failed, not left RUNNING"
        )
        assert row.resumed, "and the search went on"


def test_an_outage_as_a_trial_starts_is_waited_out(
    pg_study: Study, engine: FaultEngine, postgres: Postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tuner.fleet import loop as fleet

    held, calls, timer = fleet.Reservation.held, {"n": 0}, threading.Timer(3.0, postgres.start)

    def down_for_a_moment(self: fleet.Reservation) -> object:
        calls["n"] += 1
        if calls["n"] == 3:  # the defaults' enqueue, trial 0's start, then trial 1's start
            postgres.stop()
            timer.start()
        return held(self)

    monkeypatch.setattr(fleet.Reservation, "held", down_for_a_moment)
    code, err = pg_study.search(2)
    timer.join()
    assert code == 0, err
    assert states(pg_study.trials()) == [("COMPLETE", None), ("COMPLETE", None)]
