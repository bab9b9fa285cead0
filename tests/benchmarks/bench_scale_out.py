"""Scale-out: the same study budget run by 1, 2 and 3 `tuner worker` processes on one PostgreSQL.

Run: ``scripts/test.sh``'s PostgreSQL must be up: ``TUNER_TEST_POSTGRES=postgresql+psycopg2://...
.venv/bin/python -m tests.benchmarks.bench_scale_out [--trials 6] [--rounds 2]`` (about 12 minutes on 2 cores).
Not part of the default test run. Writes ``reports/scale-out.md`` and ``reports/scale_out.json``.

Each run makes a fresh study (``tuner search --trials 0``: the engine default enqueued, nothing
booted), starts the workers together and times them to the last one's exit. The kill run starts 3
workers and SIGKILLs one of them in the middle of its trial, as ``tests/fleet`` does. Reported per
run, side by side: workers, trials requested, completed trials recorded, duplicated trial numbers,
trials retried after the kill, the wall time of the run and per completed trial, the median boot
and drive time of the trials, and the speedup over one worker.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import optuna
import psutil

from tests.benchmarks import _report

SPACE = "engines: [vllm]\nparameters:\n  chunk_size: {choices: [512, 1024, 2048]}\n  max_num_seqs: {choices: [2, 4]}\n"
FAST_HEARTBEAT = {"TUNER_HEARTBEAT_S": "2", "TUNER_HEARTBEAT_GRACE_S": "12"}


def _tuner(*args: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "tuner", *args], cwd=_report.ROOT, stdout=log.open("wb"),
                            stderr=subprocess.STDOUT, env={**os.environ, **FAST_HEARTBEAT})  # fmt: skip


def one_run(url: str, workers: int, trials: int, work: Path, kill: bool = False) -> dict[str, Any]:
    name = f"scale-{workers}-{uuid.uuid4().hex[:6]}"
    flags = ["--requests", "6", "--trials", "0", "--repeats", "0", "--no-stress", "--space", str(work / "space.yaml"),
             "--objective", "pareto"]  # fmt: skip
    made = _tuner(
        "search", "--workload", "rag", "--study", name, "--storage", url, *flags, log=work / f"{name}-make.log"
    )
    assert made.wait(timeout=300) == 0, (work / f"{name}-make.log").read_text()[-2000:]
    started = time.monotonic()
    procs = [_tuner("worker", "--study", name, "--storage", url, "--trials", str(trials), log=work / f"{name}-w{i}.log")
             for i in range(workers)]  # fmt: skip
    victim = _kill_one(procs, name, url) if kill else None
    for p in procs:
        if p is not victim:
            p.wait(timeout=3600)
    wall = time.monotonic() - started
    return _measure(optuna.load_study(study_name=name, storage=url), workers, trials, wall, kill)


def _kill_one(procs: list[subprocess.Popen[bytes]], name: str, url: str) -> subprocess.Popen[bytes]:
    while True:
        for t in optuna.load_study(study_name=name, storage=url).get_trials(states=(optuna.trial.TrialState.RUNNING,)):
            owner = next((p for p in procs if p.pid == (t.user_attrs.get("worker") or {}).get("pid")), None)
            if owner is not None and any("api_server" in " ".join(c.cmdline()) for c in _children(owner.pid)):
                time.sleep(3)
                owner.send_signal(signal.SIGKILL)
                owner.wait()
                return owner
        time.sleep(1)


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _measure(study: optuna.Study, workers: int, trials: int, wall: float, kill: bool) -> dict[str, Any]:
    complete = [t for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)) if t.user_attrs.get("booted")]
    numbers = [t.number for t in study.trials]
    phases = [t.user_attrs.get("phases_s") or {} for t in complete]
    return {
        "workers": workers, "killed": 1 if kill else 0, "requested": trials, "completed": len(complete),
        "failed": len(study.get_trials(states=(optuna.trial.TrialState.FAIL,))),
        "duplicates": len(numbers) - len(set(numbers)),
        "retried": sum(1 for t in study.trials if "failed_trial" in t.system_attrs),
        "distinct_workers": len({(t.user_attrs["worker"]["host"], t.user_attrs["worker"]["pid"]) for t in complete}),
        "wall_s": round(wall, 1), "wall_per_trial_s": round(wall / max(len(complete), 1), 1),
        "boot_s": _spread([p.get("boot", 0) for p in phases]),
        "drive_s": _spread([p.get("drive", 0) for p in phases]),
    }  # fmt: skip


def _spread(values: list[float]) -> dict[str, float] | None:
    """Median and range of a run's per-trial times (None: no completed trial)."""
    if not values:
        return None
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def _cell(spread: dict[str, float] | None) -> str:
    return "-" if spread is None else f"{spread['median']} ({spread['min']}-{spread['max']})"


def render(data: dict[str, Any]) -> str:
    runs = data["runs"]
    header = ["round", "workers", "killed", "requested", "completed", "failed", "duplicates", "retried",
              "workers seen", "wall s", "wall s / trial", "boot s median (min-max)",
              "drive s median (min-max)"]  # fmt: skip
    rows = [[r["round"], r["workers"], r["killed"], r["requested"], r["completed"], r["failed"], r["duplicates"],
             r["retried"], r["distinct_workers"], r["wall_s"], r["wall_per_trial_s"], _cell(r["boot_s"]),
             _cell(r["drive_s"])] for r in runs]  # fmt: skip
    return "\n".join([
        "# Scale-out (`tests/benchmarks/bench_scale_out.py`)", "",
        "`tuner worker` processes against one PostgreSQL study "
        f"(PostgreSQL {data['postgres']}), real vLLM CPU engines, {data['trials']} booted trials requested per run "
        "(rag, 6 requests each, chunk size x max_num_seqs space), heartbeat 2 s, grace 12 s. All runs measured "
        f"in this one invocation, {data['rounds']} rounds of 1, 2, 3 workers and 3 with one SIGKILLed, "
        "interleaved.", "",
        "## Wall time to the study's budget, by worker count", "",
        _report.table(["workers", "killed", "runs", "wall s median (min-max)", "speedup vs 1 worker (medians)"],
                      _summary(runs)), "",
        "## Every run", "",
        _report.table(header, rows), "",
        "What limits the speedup here: every worker's engine runs on the same 2 CPU cores, so parallel trials "
        "slow each other down (boot and drive times above grow with the workers); the speedup on a host with a "
        "GPU (or a core set) per worker is not measured here.", "",
    ])  # fmt: skip


def _summary(runs: list[dict[str, Any]]) -> list[list[Any]]:
    groups: dict[tuple[int, int], list[float]] = {}
    for r in runs:
        groups.setdefault((r["workers"], r["killed"]), []).append(r["wall_s"])
    base = statistics.median(groups[(1, 0)])
    return [[w, k, len(v), _cell(_spread(v)), f"{base / statistics.median(v):.2f}x"]
            for (w, k), v in sorted(groups.items())]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    started = _report.stamp()
    url = os.environ["TUNER_TEST_POSTGRES"]
    work = _report.ROOT / "studies" / "logs" / "benchmarks" / f"scale-out-{time.strftime('%Y%m%d-%H%M%S')}"
    work.mkdir(parents=True, exist_ok=True)
    (work / "space.yaml").write_text(SPACE)
    runs = []
    for round_ in range(1, args.rounds + 1):
        for workers, kill in ((1, False), (2, False), (3, False), (3, True)):
            runs.append({"round": round_, **one_run(url, workers, args.trials, work, kill=kill)})
    version = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.split()[2]
    data = {"stamp": started, "trials": args.trials, "runs": runs, "rounds": args.rounds, "postgres": version,
            "logs": str(work)}  # fmt: skip
    text = _report.stamped(render(data), started)
    (_report.REPORTS / "scale-out.md").write_text(text + "\n")
    (_report.REPORTS / "scale_out.json").write_text(json.dumps(data, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
