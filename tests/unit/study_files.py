"""What the committed GPU study files (reports/gpu-*/**.db) recorded, for the tests that check the
tuner against them: each trial's user attributes, read with sqlite3 from Optuna's RDB schema, read-only
so that no test writes a study file."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

REPORTS = Path(__file__).resolve().parents[2] / "reports"
# The committed study files the tests read, each named once.
H200_FIRST = REPORTS / "gpu-h200" / "rag-h200.db"
H200_CAPACITY_BLOCK4 = REPORTS / "gpu-h200" / "capacity" / "block4" / "rag-h200-capacity-4.db"
H100_STUDY = REPORTS / "gpu-h100" / "study-1" / "rag-h100-study-1.db"
H200_STUDY = REPORTS / "gpu-h200" / "study-1" / "rag-h200-study-1.db"


def recorded_attrs(db: Path) -> dict[int, dict[str, Any]]:
    """Trial number -> that trial's user attributes, for every trial that has any."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute(
            "select t.number, a.key, a.value_json from trials t join trial_user_attributes a using (trial_id)"
        ).fetchall()
    finally:
        con.close()
    out: dict[int, dict[str, Any]] = {}
    for number, key, value in rows:
        out.setdefault(number, {})[key] = json.loads(value)
    return out


def recorded_study_attrs(db: Path) -> dict[str, Any]:
    """The study's own user attributes (its capacity plan, finalists' runs, verdict), read-only."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("select key, value_json from study_user_attributes").fetchall()
    finally:
        con.close()
    return {key: json.loads(value) for key, value in rows}
