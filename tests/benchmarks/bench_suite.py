"""The README's test command, timed: `scripts/test.sh` in a fresh clone, every tier included.

Run: ``.venv/bin/python -m tests.benchmarks.bench_suite [--workers N ...]`` (about 20 minutes a run on
2 cores; it boots the real vLLM CPU build, PostgreSQL and Chromium as the suite does). Not part of the
default test run. Writes ``reports/suite.md`` and ``reports/suite.json``.

Each run clones this checkout's HEAD into a temporary folder and runs ``scripts/test.sh
--durations=10`` there with ``TUNER_TEST_WORKERS`` set, using this checkout's ``.venv`` (linked) and
engines (``TUNER_ENGINES_DIR``): the set-up half is ``scripts/setup.sh``, whose time depends on the
network and is not measured. Several ``--workers`` values run one after another, so their times sit
side by side under the same load. The goal (issue 29) is the whole suite in under ``LIMIT_S``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks import _report

LIMIT_S = 20 * 60.0  # the default test run, every tier, in a clean clone
MD_PATH = _report.REPORTS / "suite.md"
JSON_PATH = _report.REPORTS / "suite.json"
TITLE = "# The test suite, timed\n\nWritten by `tests/benchmarks/bench_suite.py`.\n"
SLOWEST = 10


def one_run(clone: Path, workers: int) -> dict[str, Any]:
    """``scripts/test.sh`` in ``clone``: its exit, wall time, pytest's own summary and slowest tests."""
    (clone / ".venv").symlink_to(_report.ROOT / ".venv")
    schemas = _report.ROOT / ".cache" / "schemas"
    if schemas.is_dir():  # the compose schema setup.sh would download
        shutil.copytree(schemas, clone / ".cache" / "schemas")
    env = {**os.environ, "TUNER_ENGINES_DIR": str(_report.ROOT / ".engines"), "TUNER_TEST_WORKERS": str(workers)}
    start = time.monotonic()
    done = subprocess.run(["scripts/test.sh", f"--durations={SLOWEST}", "-q", "-p", "no:cacheprovider"], cwd=clone,
                          env=env, capture_output=True, text=True, start_new_session=True)  # fmt: skip
    wall = time.monotonic() - start
    out = done.stdout + done.stderr
    summary = next((line.strip("= ") for line in reversed(out.splitlines()) if re.search(r" in [\d.]+s", line)), "")
    slowest = re.findall(r"^([\d.]+)s (setup|call|teardown)\s+(\S+)", out, re.M)[:SLOWEST]
    failed = re.findall(r"^FAILED (\S+)", out, re.M)
    return {"workers": workers, "rc": done.returncode, "wall_s": wall, "summary": summary, "failed": failed,
            "slowest": [{"s": float(s), "phase": p, "test": t} for s, p, t in slowest],
            "tail": out.splitlines()[-5:]}  # fmt: skip


def render(runs: list[dict[str, Any]], before: dict[str, Any], after: dict[str, Any]) -> str:
    rows = [[r["workers"], r["rc"], f"{r['wall_s'] / 60:.1f}", r["summary"],
             "yes" if r["rc"] == 0 and r["wall_s"] < LIMIT_S else "**no**"] for r in runs]  # fmt: skip
    parts = [
        "## `scripts/test.sh` in a fresh clone, every tier",
        f"Wall time of the README's test command, one run per worker count, against {LIMIT_S / 60:.0f} minutes.",
        _report.table(["workers", "exit", "wall min", "pytest's summary", f"under {LIMIT_S / 60:.0f} min"], rows),
    ]
    for r in runs:
        slow = [[f"{s['s']:.0f}", s["phase"], f"`{s['test']}`"] for s in r["slowest"]]
        parts += [f"Slowest {SLOWEST} with {r['workers']} workers (seconds each took in its worker):",
                  _report.table(["s", "phase", "test"], slow)]  # fmt: skip
        if r["failed"]:
            parts.append("Failed: " + ", ".join(f"`{t}`" for t in r["failed"]))
    parts.append(_report.contention(before, after))
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[4])
    args = parser.parse_args()
    started, before = _report.stamp(), _report.machine()
    runs = []
    for workers in args.workers:
        with tempfile.TemporaryDirectory(prefix="tuner-suite-") as tmp:
            clone = Path(tmp) / "tuner"
            subprocess.run(["git", "clone", "-q", str(_report.ROOT), str(clone)], check=True)
            runs.append(one_run(clone, workers))
            r = runs[-1]
            print(f"{workers} workers: exit {r['rc']}, {r['wall_s'] / 60:.1f} min, {r['summary']}", file=sys.stderr)
    after = _report.machine()
    if not MD_PATH.exists():
        MD_PATH.write_text(TITLE)
    data = {"stamp": started, "runs": runs, "limit_s": LIMIT_S, "machine_before": before, "machine_after": after}
    _report.write_section("suite", render(runs, before, after), data, md_path=MD_PATH, json_path=JSON_PATH)
    print(MD_PATH)


if __name__ == "__main__":
    main()
