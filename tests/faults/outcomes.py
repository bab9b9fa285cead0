"""Each fault test and fuzz property records what it saw, one JSON file each; ``tests.faults.report``
renders them into ``reports/reliability.md`` and ``.json``. Nothing here decides a test's verdict."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(os.environ.get("TUNER_RELIABILITY_DIR", ROOT / "studies" / "reliability"))


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
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"fault-{row.fault}.json").write_text(json.dumps(asdict(row), indent=1) + "\n")


def record_finding(name: str, where: str, fix: str) -> None:
    """A bug an input or fault revealed outside this suite's files, pinned by a strict ``xfail`` test
    that records it as it starts (it fails after, or the strict marker fails the run)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"finding-{name}.json").write_text(json.dumps({"finding": name, "where": where, "fix": fix}) + "\n")


@dataclass
class Tally:
    """The outcomes of one fuzz property: how many inputs, and how each ended."""

    prop: str
    tried: int = 0
    worked: int = 0
    exit2_one_line: int = 0
    other: list[str] = field(default_factory=list)  # anything else, which fails the property anyway

    def save(self) -> None:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"fuzz-{self.prop}.json").write_text(json.dumps(asdict(self), indent=1) + "\n")
