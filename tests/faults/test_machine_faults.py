"""Faults of the machine rather than the engine: the port taken between choosing and binding, and no
room left on the disk for a trial's log."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import procs
from tests.faults.harness import FaultEngine, Study, exited, lost, recorded_class, resumed, states
from tests.faults.outcomes import NEEDS_ROOT, observing


@contextlib.contextmanager
def squatted() -> Iterator[int]:
    """A port someone else is listening on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize("taken", [1, 2], ids=["once", "twice"])
def test_a_port_taken_before_the_engine_binds_it(
    taken: int, study: Study, engine: FaultEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trial's port (and, the second time, the retry's too) is given to a squatter just after it
    was chosen: once is retried on a fresh port and served; twice is ``port_in_use``."""
    from tuner.measure import process, trial

    injected = "the chosen port bound by another process before the engine started"
    with observing(f"port-taken-{'once' if taken == 1 else 'twice'}",
                   injected + ("" if taken == 1 else ", and the retry's port too")) as row:  # fmt: skip
        with squatted() as first, squatted() as second:
            ports = iter([first])
            monkeypatch.setattr(trial, "free_port", lambda: next(ports, None) or process.free_port())
            if taken == 2:
                retry = iter([second])
                monkeypatch.setattr(process, "free_port", lambda: next(retry, None) or socket_port())
            code, err = study.search(1)
        row.saw(exited(code, err))
        assert code == 0 and "Traceback" not in err, err
        [t] = study.trials()
        row.recorded = recorded_class(t)
        log = Path(t.user_attrs["log_path"]).read_text()
        said = {line: log.count(line) for line in ("Address already in use", "retrying on")}
        row.saw(f"its log says {', '.join(f'{line!r} {n}x' for line, n in said.items())}",
                f"{engine.boots()} engines booted")  # fmt: skip
        assert log.count("Address already in use") == taken and "retrying on" in log
        expected = None if taken == 1 else "port_in_use"
        assert states([t]) == [("COMPLETE", expected)]
        left = procs.left_after(10.0)
        row.processes_left = len(left)
        assert not left
        before, boots = study.trials(), engine.boots()
        code, err = study.search(2)
        assert code == 0, err
        row.trials_lost, row.resumed = lost(before, study.trials()), resumed(engine, boots, before, study.trials())
        assert row.trials_lost == 0 and row.resumed


def socket_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def full_disk(where: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted at ``where``, filled to the last byte (root only: the skip says so, in
    the fault's row and the run's summary, so the missing case is never taken for a passed one)."""
    where.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip(f"{NEEDS_ROOT} to mount a tmpfs: no full disk to test with")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:  # root in a container without the right to mount
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or f'mount exited {mounted.returncode}'}")
    try:
        filler = where / "filler"
        with contextlib.suppress(OSError), filler.open("wb") as fh:
            while True:
                fh.write(b"\0" * 4096)
                fh.flush()
        yield filler
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_no_room_for_the_trial_log_stops_the_search_with_one_line(
    study: Study, engine: FaultEngine, tmp_path: Path
) -> None:
    with observing("disk-full-for-log", "the log folder on a full file system (a filled tmpfs)") as row:
        with full_disk(tmp_path / "studies" / "logs") as filler:
            code, err = study.search(2)
            row.saw(exited(code, err), f"{engine.boots()} engines started")
            assert code == 1 and "Traceback" not in err, err
            assert err.splitlines()[-1].startswith("tuner: no room for the trial log in "), err
            assert not engine.events(), "no engine was started"
            left = procs.left_after(5.0)
            row.processes_left = len(left)
            assert not left
            trials = study.trials()
            row.recorded = ", ".join(recorded_class(t) for t in trials) or "no trial"
            assert states(trials) == [("FAIL", None)], "the trial is not scored: it is run again on resume"
            filler.unlink()  # room again
            before = study.trials()
            code, err = study.search(2)
            assert code == 0, err
        after = study.trials()
        row.resumed, row.trials_lost = resumed(engine, 0, before, after), lost(before, after)
        assert row.resumed and row.trials_lost == 0
