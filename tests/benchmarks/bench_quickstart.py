"""The Quickstart's study, timed: `tuner search --workload rag` in a fresh clone, on the no-GPU default.

Run: ``.venv/bin/python -m tests.benchmarks.bench_quickstart [--runs N]`` (about 10 minutes a run on 2
cores; real vLLM CPU engines). Not part of the default test run. Writes ``reports/quickstart.md`` and
``reports/quickstart.json``.

Each run clones this checkout's HEAD into a temporary folder and runs the README's command there,
with this checkout's ``.venv`` and engines (``TUNER_ENGINES_DIR``): the set-up half of the Quickstart
is ``scripts/setup.sh``, whose time depends on the network and is not measured here. Every progress
line is stamped as it arrives, so the table splits the wall time into the search's trials, the
finalists' repeats and the rest. The README promises the study ends in under ``LIMIT_S``.

``--vs-sampler NAME`` times the same study with ``--sampler NAME`` in turn with the README's command,
each round in a fresh clone of its own: how the default sampler's proposals weigh on the study's
wall time against another sampler's, side by side on one machine in one run.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.benchmarks import _report

LIMIT_S = 600.0  # the README's Quickstart: the study in under 10 minutes
MD_PATH = _report.REPORTS / "quickstart.md"
JSON_PATH = _report.REPORTS / "quickstart.json"
TITLE = "# The Quickstart's study, timed\n\nWritten by `tests/benchmarks/bench_quickstart.py`.\n"


README_ARGS = ["search", "--workload", "rag"]
README_COMMAND = " ".join(["tuner", *README_ARGS])


def one_run(clone: Path, extra: list[str]) -> dict[str, Any]:
    """The README's study command (with ``extra`` appended) in ``clone``: every stderr line with its
    second since the start."""
    env = {**os.environ, "TUNER_ENGINES_DIR": str(_report.ROOT / ".engines")}
    argv = [str(_report.ROOT / ".venv" / "bin" / "tuner"), *README_ARGS, *extra]
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    with subprocess.Popen(argv, cwd=clone, env=env, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:  # fmt: skip
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic() - start, line.rstrip("\n")))
        stdout = proc.stdout.read() if proc.stdout else ""
        rc = proc.wait()
    wall = time.monotonic() - start
    return {"command": " ".join([README_COMMAND, *extra]), "rc": rc, "wall_s": wall,
            "phases": phases(lines, wall), "boots": boots(lines),
            "verdict": next((t for _, t in reversed(lines) if t.startswith("verdict")), None),
            "tail": [t for _, t in lines[-5:]] + stdout.splitlines()[-3:]}  # fmt: skip


def phases(lines: list[tuple[float, str]], wall: float) -> dict[str, float]:
    """Seconds before the first trial boots, in the trials, in the finalists, and after them."""
    first = next((s for s, t in lines if re.match(r"trial\s+\d+ boot", t)), wall)
    finals = next((s for s, t in lines if t.startswith("finalists:")), wall)
    last = max((s for s, t in lines if re.match(r"(trial|repeat|stress|verdict)", t)), default=wall)
    return {"setup_s": first, "trials_s": finals - first, "finalists_s": max(last - finals, 0.0),
            "end_s": max(wall - max(last, finals), 0.0)}  # fmt: skip


def boots(lines: list[tuple[float, str]]) -> list[float]:
    """Each boot's seconds as its warm-up line says ("boot 56 s")."""
    return [float(m[1]) for _, t in lines if (m := re.search(r"boot (\d+(?:\.\d+)?) s", t))]


def command_of(run: dict[str, Any]) -> str:
    return str(run.get("command", README_COMMAND))  # runs stored before --vs-sampler: the README's


def render(runs: list[dict[str, Any]], started: dict[str, Any], before: dict[str, Any], after: dict[str, Any]) -> str:
    commands = list(dict.fromkeys(command_of(r) for r in runs))
    summary = []
    for command in commands:
        walls = [r["wall_s"] for r in runs if command_of(r) == command]
        low, high = _report.spread(walls)
        limit = f", against the README's {LIMIT_S:.0f} s" if command == README_COMMAND else ""
        summary.append(f"`{command}`: wall time of the study, median {_report.median(walls):.0f} s over "
                       f"{len(walls)} run(s) (range {low:.0f}-{high:.0f} s){limit}.")  # fmt: skip
    rows = [[i + 1, f"`{command_of(r)}`", r["rc"], f"{r['wall_s']:.0f}", f"{r['phases']['setup_s']:.0f}",
             f"{r['phases']['trials_s']:.0f}",
             f"{r['phases']['finalists_s']:.0f}", len(r["boots"]),
             f"{_report.median(r['boots']):.0f}" if r["boots"] else "n/a",
             "yes" if r["rc"] == 0 and r["wall_s"] < LIMIT_S else "**no**"] for i, r in enumerate(runs)]  # fmt: skip
    order = "The commands ran in turn, each in a fresh clone." if len(commands) > 1 else ""
    verdicts = "\n".join(f"- run {i + 1}: `{r['verdict']}`" for i, r in enumerate(runs) if r["verdict"])
    failed = [r for r in runs if r["rc"] != 0]
    failures = "\n".join(f"- exit {r['rc']}: " + " / ".join(f"`{t}`" for t in r["tail"]) for r in failed)
    return "\n\n".join(x for x in (
        "## `tuner search --workload rag` in a fresh clone, on the vLLM CPU build",
        "\n".join(f"- {line}" for line in summary) if len(summary) > 1 else summary[0],
        order,
        _report.table(["run", "command", "exit", "wall s", "before the first boot s", "trials s", "finalists s",
                       "boots", "median boot s", f"under {LIMIT_S:.0f} s"], rows),  # fmt: skip
        "The trials are the search (each engine's default first, then sampled configs, the memory screen "
        "and the pruner as a user gets them); the finalists are the fresh-boot repeats and the stress check. "
        "What each run ended with:\n" + verdicts if verdicts else "",
        "Runs that failed:\n" + failures if failures else "",
        _report.contention(before, after),
    ) if x)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--vs-sampler", default=None, help="also time the study with --sampler NAME, in turn")
    args = parser.parse_args()
    variants: list[list[str]] = [[]] + ([["--sampler", args.vs_sampler]] if args.vs_sampler else [])
    started, before = _report.stamp(), _report.machine()
    runs = []
    for _ in range(args.runs):
        for extra in variants:
            with tempfile.TemporaryDirectory(prefix="tuner-quickstart-") as tmp:
                clone = Path(tmp) / "tuner"
                subprocess.run(["git", "clone", "-q", str(_report.ROOT), str(clone)], check=True)
                runs.append(one_run(clone, extra))
                print(f"run {len(runs)} ({runs[-1]['command']}): exit {runs[-1]['rc']}, {runs[-1]['wall_s']:.0f} s",
                      file=sys.stderr)  # fmt: skip
    after = _report.machine()
    if not MD_PATH.exists():
        MD_PATH.write_text(TITLE)
    markdown = render(runs, started, before, after)
    data = {"stamp": started, "runs": runs, "limit_s": LIMIT_S, "machine_before": before, "machine_after": after}
    _report.write_section("quickstart", markdown, data, md_path=MD_PATH, json_path=JSON_PATH)
    print(MD_PATH)


if __name__ == "__main__":
    main()
