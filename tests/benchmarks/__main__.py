"""Regenerate the measured reports from one command.

    python -m tests.benchmarks                  list every benchmark and the report it writes
    python -m tests.benchmarks NAME [ARGS...]   run one (ARGS go to it: bench_noise --repeats 3)
    python -m tests.benchmarks all              run every report's benchmark in turn

Each runs in its own process as ``python -m tests.benchmarks.NAME``, exactly as its docstring says.
Those that boot vLLM hold ``/tmp/tuner-engine.lock`` while they run (the lock ``flock`` takes), so
they never overlap on the shared cores; ``bench_scale_out`` runs beside a throwaway PostgreSQL
(``scripts/with-postgres.sh``) unless ``TUNER_TEST_POSTGRES`` names one. ``all`` goes on past a
failure and exits 1 naming the benchmarks that failed. ``--dry-run`` prints the commands instead.
"""

from __future__ import annotations

import argparse
import ast
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ENGINE_LOCK = Path("/tmp/tuner-engine.lock")
BOOTS_VLLM = {
    "bench_capacity",
    "bench_capacity_trust",
    "bench_quickstart",
    "bench_workloads",
    "bench_fidelity",
    "bench_noise",
    "bench_stress_demo",
    "bench_suite",
    "bench_scale_out",
    "measure_grid",
    "measure_capacity_grid",
}
NEEDS_POSTGRES = {"bench_scale_out"}
# What ``all`` runs, in order: one entry per report section. ``measure_grid`` and ``measure_capacity_grid``
# are left out: they measure the committed tables ``bench_search`` replays (an hour or two each), not a
# report; run them by name.
ALL: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bench_capacity", ()),
    ("bench_capacity_trust", ()),
    ("bench_driver_capacity", ()),
    ("bench_fidelity", ()),
    ("bench_fidelity", ("--pin",)),
    ("bench_noise", ()),
    ("bench_prometheus", ()),
    ("bench_saturation", ()),
    ("bench_known_search", ()),
    ("bench_tier_search", ()),
    ("bench_quickstart", ()),
    ("bench_search", ()),
    ("bench_model", ()),
    ("bench_model_study", ()),
    ("bench_model_study", ("--card", "h100")),
    ("bench_proposal", ()),
    ("bench_stress_demo", ()),
    ("bench_suite", ()),
    ("bench_scale_out", ()),
    ("bench_workloads", ()),
    ("reliability", ()),
)
# Not a benchmark module: the fault suite and the fuzz properties, then the report of what they recorded.
RELIABILITY = (
    ("scripts/test.sh", "tests/faults", "tests/unit/cli/test_fuzz_inputs.py", "tests/unit/cli/test_safety.py"),
    (sys.executable, "-m", "tests.faults.report"),
)
ELSEWHERE = ("reports/gpu-h200.md: scripts/gpu/ on an H200 (see that report)",)


def benchmarks() -> dict[str, str]:
    """Every benchmark module here and the first line of its docstring, read without importing it."""
    found = {}
    for path in sorted([*HERE.glob("bench_*.py"), *HERE.glob("measure_*.py")]):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        found[path.stem] = doc.splitlines()[0].replace("``", "`") if doc else ""
    found["reliability"] = "The fault suite and fuzz properties, then `python -m tests.faults.report`."
    return found


def list_them() -> None:
    names = benchmarks()
    width = max(map(len, names))
    for name, what in names.items():
        needs = [n for n, on in (("boots vLLM", name in BOOTS_VLLM), ("PostgreSQL", name in NEEDS_POSTGRES)) if on]
        print(f"{name:<{width}}  {what}" + (f" [{', '.join(needs)}]" if needs else ""))
    print("\n`all` runs: " + ", ".join(" ".join((n, *a)) for n, a in ALL))
    print("Written elsewhere: " + "; ".join(ELSEWHERE))


def commands(name: str, args: Sequence[str]) -> list[list[str]]:
    if name == "reliability":
        return [[*RELIABILITY[0], *args], list(RELIABILITY[1])]
    command = [sys.executable, "-m", f"tests.benchmarks.{name}", *args]
    if name in NEEDS_POSTGRES and not os.environ.get("TUNER_TEST_POSTGRES"):
        command = ["scripts/with-postgres.sh", *command]
    return [command]


@contextmanager
def engine_lock(name: str) -> Iterator[None]:
    """Hold the engine lock while a benchmark that boots vLLM runs."""
    if name not in BOOTS_VLLM:
        yield
        return
    with ENGINE_LOCK.open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"benchmarks: {name} waits for {ENGINE_LOCK} (another engine run holds it)", file=sys.stderr)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # released when the file closes


def run(name: str, args: Sequence[str], dry_run: bool) -> int:
    steps = commands(name, args)
    if dry_run:
        print("\n".join(" ".join(step) for step in steps))
        return 0
    print(f"benchmarks: running {' '.join((name, *args))}", file=sys.stderr, flush=True)
    code = 0
    with engine_lock(name):
        for step in steps:  # reliability renders its report even when a test failed: missing rows say so
            code = subprocess.run(step, cwd=ROOT, check=False).returncode or code
    return code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks", description=__doc__.splitlines()[0], epilog="Run with no name to list them."
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands instead of running them")
    parser.add_argument("name", nargs="?", default="list", help="a benchmark's name, `all`, or `list` (the default)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for that benchmark")
    ns = parser.parse_args(argv)
    names = benchmarks()
    if ns.name == "list":
        list_them()
        return 0
    if ns.name == "all":
        if ns.args:
            parser.error("`all` takes no arguments: run a benchmark by name to pass it some")
        failed = [" ".join((n, *a)) for n, a in ALL if run(n, a, ns.dry_run) != 0]
        if failed:
            print(f"benchmarks: failed: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0
    if ns.name not in names:
        parser.error(f"no benchmark {ns.name!r}; known: {', '.join(names)}, all, list")
    return run(ns.name, ns.args, ns.dry_run)


if __name__ == "__main__":
    sys.exit(main())
