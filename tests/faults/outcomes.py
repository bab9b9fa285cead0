"""Each fault test and fuzz property records what it saw, one JSON file each; ``tests.faults.report``
renders them into ``reports/reliability.md`` and ``.json``. Nothing here decides a test's verdict.

Records are kept by test run: each run writes into its own folder ``RESULTS/<run id>/``, with the
run's stamp (commit, dirty tree, start time, machine, engines) in ``run.json`` beside them, and every
record names its run. ``start_run`` (``tests/conftest.py``, once per pytest session) sets the run id
``TUNER_RUN_ID`` and takes the stamp before any test changes the environment; processes a test
starts inherit both. Set ``TUNER_RUN_ID`` yourself to make several sessions one run.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

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


@dataclass
class FaultRow:
    fault: str  # a short name
    injected: str  # what the test did
    tuner_did: str  # what the tuner did about it
    recorded: str  # the trial's recorded class (or state)
    processes_left: int
    trials_lost: int
    resumed: bool
    engine: str = "fault server"  # or "vLLM CPU"


def record_fault(row: FaultRow) -> None:
    _write(f"fault-{row.fault}.json", asdict(row))


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

    def save(self) -> None:
        _write(f"fuzz-{self.prop}.json", asdict(self))
