"""The reliability report shows a failure: a fault's row is written however its test ends, and the
report renders a failed, a skipped and a missing fault each visibly. Fast: no engine, no study."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults import outcomes, report
from tests.faults.outcomes import NO_NEXT_RUN, NOT_OBSERVED, first_line, observing

ROOT = Path(__file__).resolve().parents[2]
RUN = "unit-run"
FAILED = "assert 'served (feasible)' == 'request_errors' (trial 1 served)"  # the outcome of the failed fault below
DISK_FULL = "tests/faults/test_machine_faults.py::test_no_room_for_the_trial_log_stops_the_search_with_one_line"


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own record folder, so nothing it writes reaches the run's real records."""
    monkeypatch.setattr(outcomes, "RESULTS", tmp_path)
    monkeypatch.setenv(outcomes.RUN_ENV, RUN)
    return tmp_path / RUN


def _record_three() -> None:
    """One fault that held, one whose assertion failed half way, one skipped for lack of root."""
    with observing("never_ready", "/health answers 503 forever") as row:
        row.saw("the search exited 0", "trial 1's engine stopped with SIGTERM")
        row.recorded, row.processes_left, row.trials_lost, row.resumed = "boot_timeout", 0, 0, True
    with pytest.raises(AssertionError), observing("http_500", "every completion answers HTTP 500") as row:
        row.saw("the search exited 0")
        row.recorded = "served (feasible)"
        assert row.recorded == "request_errors", "trial 1 served\nsecond line"
    with pytest.raises(pytest.skip.Exception), observing("disk-full-for-log", "a full tmpfs") as row:
        pytest.skip(f"{outcomes.NEEDS_ROOT} to mount a tmpfs: no full disk to test with")


def test_a_row_is_written_however_its_test_ends(run: Path) -> None:
    _record_three()
    rows = {p.name: json.loads(p.read_text()) for p in run.glob("fault-*.json")}
    assert rows["fault-never_ready.json"]["outcome"] == "passed"
    failed = rows["fault-http_500.json"]
    assert failed["outcome"] == f"failed: {FAILED}", "what was compared and the message, in one line"
    assert failed["recorded"] == "served (feasible)", "what was observed before the assertion is kept"
    assert failed["tuner_did"] == ["the search exited 0"]
    assert (failed["processes_left"], failed["trials_lost"], failed["resumed"]) == (None, None, None)
    skipped = rows["fault-disk-full-for-log.json"]
    assert skipped["outcome"] == "skipped: needs root to mount a tmpfs: no full disk to test with"
    assert skipped["recorded"] == NOT_OBSERVED and skipped["tuner_did"] == []
    assert {r["run_id"] for r in rows.values()} == {RUN}


def test_the_first_line_of_an_error_names_it() -> None:
    assert first_line(AssertionError("\nassert 1 == 0\n  where ...")) == "assert 1 == 0"
    stderr = "rag: model context 2048 is shorter than the preset needs\ntuner: done"
    assert first_line(AssertionError(f"{stderr}\nassert [('FAIL', None)] == [('COMPLETE', None)]\n  At index 0")) == (
        "assert [('FAIL', None)] == [('COMPLETE', None)] (rag: model context 2048 is shorter than the preset needs)"
    ), "what was compared first, then the message's first line"
    assert first_line(AssertionError()) == "assertion failed"
    assert first_line(TimeoutError("no 'boot' event in 60 s\nmore")) == "TimeoutError: no 'boot' event in 60 s"
    assert first_line(KeyboardInterrupt()) == "KeyboardInterrupt"
    cut = first_line(AssertionError("x" * 500))
    assert len(cut) == outcomes.ERROR_CHARS and cut.endswith("…")


def test_a_failed_a_skipped_and_a_missing_fault_each_show_in_the_report(run: Path) -> None:
    _record_three()
    data = report.load(run)
    t = data["totals"]
    assert (t["expected"], t["faults"], t["passed"], t["failed"], t["skipped"], t["missing"]) == (
        len(report.EXPECTED_FAULTS), 3, 1, 1, 1, len(report.EXPECTED_FAULTS) - 3)  # fmt: skip
    assert (t["processes_left_not_observed"], t["resume_observed"], t["resume_not_observed"]) == (2, 1, 2)
    text = report.render(data)
    lines = {line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| passed |" in lines["never_ready"] and "trial 1's engine stopped with SIGTERM" in lines["never_ready"]
    assert f"| **FAILED**: {FAILED} |" in lines["http_500"]
    assert lines["http_500"].endswith(f"| served (feasible) | {NOT_OBSERVED} | {NOT_OBSERVED} | {NOT_OBSERVED} |")
    assert "| **SKIPPED**: needs root to mount a tmpfs" in lines["disk-full-for-log"]
    assert "| **MISSING**: no record in this run |" in lines["SIGKILL-tuner"], "a missing fault has its row too"
    assert f"**{len(report.EXPECTED_FAULTS)} faults expected, 1 passed**: 1 failed, 1 skipped, " in text
    assert f"**Not passed in this run**: `http_500` failed: {FAILED}; `disk-full-for-log` skipped: needs" in text
    assert "**Missing from this run**" in text and "`SIGKILL-tuner`" in text.split("**Missing from this run**")[1]
    json.dumps(data)  # what main() writes as reliability.json


def test_a_run_that_held_says_so_without_a_failure_line(run: Path) -> None:
    for fault in report.EXPECTED_FAULTS:
        with observing(fault, "injected") as row:
            row.processes_left, row.trials_lost, row.resumed = 0, 0, NO_NEXT_RUN if "export" in fault else True
    text = report.render(report.load(run))
    n = len(report.EXPECTED_FAULTS)
    assert f"**{n} faults expected, {n} passed**.\n" in text
    assert "FAILED" not in text and "SKIPPED" not in text and "MISSING" not in text and "Not passed" not in text
    resumable = sum("export" not in f for f in report.EXPECTED_FAULTS)
    assert f"study resumed after {resumable} of the {resumable} where it was observed" in text


def test_a_record_of_an_earlier_run_reads_as_it_was_written(run: Path) -> None:
    """Before outcomes were kept a row was written only once its test had passed, what the tuner did
    in one sentence: ``--run`` on such a run still renders it."""
    run.mkdir()
    old = {"fault": "slow", "injected": "a token every 40 ms", "tuner_did": "measured the slowness",
           "recorded": "served (feasible)", "processes_left": 0, "trials_lost": 0, "resumed": True,
           "engine": "fault server"}  # fmt: skip
    (run / "fault-slow.json").write_text(json.dumps(old))
    [row] = report.load(run)["faults"]
    assert row["outcome"] == "passed" and row["tuner_did"] == ["measured the slowness"]
    assert "| slow | passed | fault server | a token every 40 ms | measured the slowness |" in report.render(
        report.load(run)
    )


def test_a_fault_test_skipped_for_lack_of_root_says_so_in_its_row_and_the_summary(tmp_path: Path) -> None:
    """The disk-full test run as a user who is not root (``os.geteuid`` says so, in a pytest of its
    own): it skips before mounting anything, its row says why, and so does the run's summary."""
    (tmp_path / "not_root.py").write_text("import os\n\nos.geteuid = lambda: 1000  # a user, not root\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", outcomes.RUN_ENV: "not-root",
           "TUNER_RELIABILITY_DIR": str(tmp_path / "records")}  # fmt: skip
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "not_root", "-p", "no:cacheprovider", DISK_FULL],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 fault test skipped, 1 for lack of root" in done.stdout, done.stdout[-3000:]
    assert f"SKIPPED {DISK_FULL}: needs root to mount a tmpfs" in done.stdout, done.stdout[-3000:]
    row = json.loads((tmp_path / "records" / "not-root" / "fault-disk-full-for-log.json").read_text())
    assert row["outcome"] == "skipped: needs root to mount a tmpfs: no full disk to test with"
    assert (row["processes_left"], row["resumed"], row["recorded"]) == (None, None, NOT_OBSERVED)
