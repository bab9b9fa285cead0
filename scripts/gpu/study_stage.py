"""Which stage a card's study is at, from its file: ``sampling N``, ``finalists N`` or ``done N`` (N
booted trials).

Run by pick_stage.sh in a block's call 1 on the device before anything is set up (python3 with the
standard library only: the tuner is not installed yet): call 1 carries both stages' archives, and
the stage read here picks which one runs and with which settings, so that a card whose study still
samples samples from ``gpu-study-1`` and one at its finalists repeats them from the finalists' tag
(reports/gpu-h200/study-1/RUNBOOK.md, "Two studies, one per card").

A study samples until it has ``TRIALS`` booted trials, counted as ``tuner.fleet.loop.boots_used``
counts them (COMPLETE, PRUNED or RUNNING, and booted: the ``booted`` attribute, else not screened by
the memory screen nor a failed stress check's record); tests/unit/test_gpu_transport.py holds the
two counts equal on both study files. A study with no file yet samples. A study whose finalists'
verdict and every tier's ``tuner verify`` report are stored, none an error, is done: a block on its
card would resume it only to find nothing left, so call 1 says so and the machine goes back (the
tuner's ``verify`` attribute keeps a tier's report with the ``error`` it could not be checked for,
and a resumed search checks that tier again).

    python3 scripts/gpu/study_stage.py STUDY_DB STUDY_NAME TRIALS
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

COUNTED = ("COMPLETE", "PRUNED", "RUNNING")
NEVER_BOOTED = {"failure": "screened", "config_kind": "stress_check"}  # tuner.study.attrs


def _read(db: str, sql: str, args: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """One query's rows, read-only from Optuna's tables."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def booted_trials(db: str, study: str) -> int:
    """The study's booted trials."""
    rows = _read(
        db,
        "select t.trial_id, a.key, a.value_json from trials t join studies s using (study_id) "
        "left join trial_user_attributes a on a.trial_id = t.trial_id "
        f"where s.study_name = ? and t.state in ({', '.join('?' * len(COUNTED))})",
        (study, *COUNTED),
    )
    attrs: dict[int, dict[str, object]] = {}
    for trial_id, key, value in rows:
        attrs.setdefault(trial_id, {})
        if key is not None:
            attrs[trial_id][key] = json.loads(value)
    return sum(1 for a in attrs.values() if a.get("booted", not any(a.get(k) == v for k, v in NEVER_BOOTED.items())))


def finished(db: str, study: str) -> bool:
    """Whether the study's verdict and a verify report per tier, none an error, are stored."""
    rows = _read(
        db,
        "select a.key, a.value_json from study_user_attributes a join studies s using (study_id) "
        "where s.study_name = ? and a.key in ('verdict', 'verify')",
        (study,),
    )
    attrs = {key: json.loads(value) for key, value in rows}
    verdict, verify = attrs.get("verdict"), attrs.get("verify")
    return (isinstance(verdict, dict) and bool(verdict.get("kind")) and isinstance(verify, dict) and bool(verify)
            and all(isinstance(r, dict) and "error" not in r for r in verify.values()))  # fmt: skip


def stage(db: str, study: str, trials: int) -> str:
    booted = booted_trials(db, study) if Path(db).is_file() else 0
    if booted < trials:
        return f"sampling {booted}"
    return f"{'done' if finished(db, study) else 'finalists'} {booted}"


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print("usage: study_stage.py STUDY_DB STUDY_NAME TRIALS", file=sys.stderr)
        sys.exit(2)
    print(stage(sys.argv[1], sys.argv[2], int(sys.argv[3])))
