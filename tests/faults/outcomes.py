"""Each fault test and fuzz property records what it saw, one JSON file each; ``tests.faults.report``
renders them into ``reports/reliability.md`` and ``.json``. Nothing here decides a test's verdict.

Records are kept by test run: each run writes into its own folder ``RESULTS/<run id>/``, with the
run's stamp (commit, dirty tree, start time, machine, engines) in ``run.json`` beside them, and every
record names its run. ``start_run`` (``tests/conftest.py``, once per pytest session) sets the run id
``TUNER_RUN_ID`` and takes the stamp before any test changes the environment; processes a test
starts inherit both. Set ``TUNER_RUN_ID`` yourself to make several sessions one run.

A fault's row is written whatever the end of its test: ``observing`` makes the row, the test fills
each field as it observes it (before asserting on it), and the row is written on the way out with
the test's outcome, passed, failed (with the error in one line) or skipped (with the reason).
So a failing fault is a row saying what was seen up to the failure, never a row that is only absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import pytest

from tests.benchmarks.stamp import stamp

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(os.environ.get("TUNER_RELIABILITY_DIR", ROOT / "studies" / "reliability"))
RUN_ENV = "TUNER_RUN_ID"
STAMP_ENV = "TUNER_RUN_STAMP"  # the run's stamp as JSON, taken at its start


def new_run_id() -> str:
    """A fresh run id: the UTC start time, then the process id, so ids sort by start and never collide."""
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{os.getpid()}"


def start_run() -> None:
    """Name and stamp this test run, unless a parent process already did."""
    os.environ.setdefault(RUN_ENV, new_run_id())
    if STAMP_ENV not in os.environ:
        os.environ[STAMP_ENV] = json.dumps(stamp())


def run_id() -> str:
    """This run's id (``TUNER_RUN_ID``; made and exported here when nothing set it)."""
    value = os.environ.setdefault(RUN_ENV, new_run_id())
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
        raise ValueError(f"{RUN_ENV}={value!r}: use letters, digits, '.', '_' and '-' only (it names a folder)")
    return value


def run_dir() -> Path:
    """This run's folder, stamped by whichever record comes first (with the stamp of the run's start)."""
    folder = RESULTS / run_id()
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "run.json").exists():
        mine = folder / f".run-{os.getpid()}.json"
        started = json.loads(os.environ[STAMP_ENV]) if STAMP_ENV in os.environ else stamp()
        mine.write_text(json.dumps({"run_id": folder.name, **started}, indent=1) + "\n")
        try:
            os.link(mine, folder / "run.json")  # atomic: of two first records, one stamp wins whole
        except FileExistsError:
            pass
        finally:
            mine.unlink()
    return folder


def _write(name: str, record: dict[str, Any]) -> None:
    folder = run_dir()
    record = {**record, "run_id": folder.name, "recorded_at": f"{datetime.now(UTC):%Y-%m-%dT%H:%M:%SZ}"}
    (folder / name).write_text(json.dumps(record, indent=1) + "\n")


NOT_OBSERVED = "not observed"  # a field the test never reached (it failed or was skipped first)
NO_NEXT_RUN: Final = "n/a"  # ``resumed`` of a fault after which nothing is run again (there is nothing to resume)
NEEDS_ROOT = "needs root"  # how a fault test skipped for lack of root starts its reason (the summary lists those)
ERROR_CHARS = 200  # of an error's first line in a row: enough to name what failed, short enough for a table cell


@dataclass
class FaultRow:
    """What one fault test saw. Fields the test observes start as not observed (None) and stay so
    when the test ends before it observes them."""

    fault: str  # a short name
    injected: str  # what the test did
    engine: str = "fault server"  # or "vLLM CPU <version>"
    outcome: str = "not finished"  # "passed", "failed: <the error in one line>" or "skipped: <reason>"
    tuner_did: list[str] = field(default_factory=list)  # what the tuner was seen to do, fact by fact
    recorded: str = NOT_OBSERVED  # the trial's recorded class (or state), read from the study
    processes_left: int | None = None
    trials_lost: int | None = None
    resumed: bool | Literal["n/a"] | None = None

    def saw(self, *facts: str) -> None:
        """Add what the tuner was seen to do, in the order it was seen."""
        self.tuner_did.extend(facts)


def record_fault(row: FaultRow) -> None:
    _write(f"fault-{row.fault}.json", asdict(row))


def first_line(error: BaseException) -> str:
    """What failed, in one line cut to ``ERROR_CHARS``. A failed assertion is pytest's ``assert ...``
    line first (it says what was compared), then the first line of the test's own message: that
    message is often a command's whole stderr, whose first line can be any notice. Other errors are
    their type and first line; a skip or ``pytest.fail`` its reason."""
    text = str(getattr(error, "msg", None) or error)  # pytest's outcomes keep their message in ``msg``
    lines = [part.strip() for part in text.splitlines() if part.strip()]
    compared = next((i for i, part in enumerate(lines) if part.startswith("assert ")), None)
    if isinstance(error, AssertionError) and compared is not None:
        said = lines[0] if compared > 0 else ""
        line = lines[compared] + (f" ({said})" if said else "")
    else:
        line = lines[0] if lines else ""
        if not isinstance(error, AssertionError | pytest.fail.Exception | pytest.skip.Exception):
            line = f"{type(error).__name__}: {line}" if line else type(error).__name__
    line = line or "assertion failed"
    return line if len(line) <= ERROR_CHARS else line[: ERROR_CHARS - 1] + "…"


@contextlib.contextmanager
def observing(fault: str, injected: str, engine: str = "fault server") -> Iterator[FaultRow]:
    """The row of one fault, written when the block ends however it ends, with how it ended. The
    error or skip goes on to pytest as it came: the row records the verdict, it never makes it."""
    row = FaultRow(fault, injected, engine)
    try:
        yield row
        row.outcome = "passed"
    except pytest.skip.Exception as skip:
        row.outcome = f"skipped: {first_line(skip)}"
        raise
    except BaseException as error:  # an interrupted run (Ctrl-C) leaves a row saying so, too
        row.outcome = f"failed: {first_line(error)}"
        raise
    finally:
        record_fault(row)


def record_finding(name: str, where: str, fix: str) -> None:
    """A bug an input or fault revealed outside this suite's files, pinned by a strict ``xfail`` test
    that records it as it starts (it fails after, or the strict marker fails the run)."""
    _write(f"finding-{name}.json", {"finding": name, "where": where, "fix": fix})


@dataclass
class Tally:
    """The outcomes of one fuzz property: how many inputs, and how each ended."""

    prop: str
    tried: int = 0
    worked: int = 0
    exit2_one_line: int = 0
    other: list[str] = field(default_factory=list)  # anything else, which fails the property anyway
    outcome: str = "not finished"  # "passed" or "failed: <the error in one line>"

    @contextlib.contextmanager
    def kept(self) -> Iterator[Tally]:
        """Run the property and its checks inside; the tally is written however they end."""
        try:
            yield self
            self.outcome = "passed"
        except BaseException as error:
            self.outcome = f"failed: {first_line(error)}"
            raise
        finally:
            _write(f"fuzz-{self.prop}.json", asdict(self))
