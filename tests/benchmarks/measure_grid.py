"""Measure every config of ``search_spaces/grid-cpu.yaml`` once on the real vLLM CPU build.

Run: ``.venv/bin/python -m tests.benchmarks.measure_grid [--out FILE] [--limit N] [--space FILE]``
(about an hour on 2 cores for the 168 configs; ``--space`` measures another space's configs, as
``grid-cpu-ngram.yaml`` into ``grid_vllm_cpu_rag_ngram.json``). Not part of the default test run.
Resumable: configs already in the output file are skipped, so an interrupted run continues where it
stopped.

Each config runs exactly as a ``tuner search`` trial does (``tuner.measure.trial.run_trial``: fresh boot,
discarded warmup, prefix cache reset, 40 rag requests at concurrency 4, seed 0), then, on the same
server, the stress run of ``tuner.measure.stress`` (the longest request at peak concurrency, cold cache).
For every config the file keeps the failure class, the summary metrics, one row per request (so
any percentile, goodput under any SLO, or what a pruner saw at any point can be recomputed), the
stress run's raw outcome, the wall time of every phase, and the engine's own memory lines from its
log (KV cache size in tokens, or the largest model length that would have fit). The order is
shuffled with a fixed seed so drift in the machine's load spreads over the grid rather than over
one parameter. ``bench_search`` replays the samplers against this table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path
from typing import Any, cast

import optuna

from tests.benchmarks import _report
from tests.benchmarks._table import grid_offers
from tuner.measure.stress import VERSION as STRESS_VERSION
from tuner.measure.trial import TrialContext, run_trial
from tuner.progress import Progress
from tuner.search.grid import grid_points, shuffled
from tuner.search.run import SearchOptions, detect_device, resolve_engines, resolve_models, resolve_workload
from tuner.search.space import load_space, suggest

SPACE = _report.ROOT / "search_spaces" / "grid-cpu.yaml"
OUT = _report.ROOT / "tests" / "benchmarks" / "data" / "grid_vllm_cpu_rag.json"
LOG_DIR = _report.ROOT / "studies" / "logs" / "grid"
MEMORY_LINES = re.compile(r"KV cache size|estimated maximum model length|KV cache is needed|Available KV cache memory")


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True)


def _current(row: dict[str, Any] | None) -> bool:
    """Measured, and with today's stress run (a served row of an older definition is measured again)."""
    if row is None:
        return False
    return row["failure"] is not None or (row.get("stress") or {}).get("version") == STRESS_VERSION


def _memory_lines(log_path: str) -> list[str]:
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = [ln.split("] ", 1)[-1] for ln in lines if MEMORY_LINES.search(ln)]
    return list(dict.fromkeys(found))[:4]


def measure(out: Path, limit: int | None, space_path: Path = SPACE) -> None:
    space = load_space(space_path)
    opts = SearchOptions(workload="rag", space=space_path)
    progress = Progress()
    engines = resolve_engines(space, {}, None, progress)
    env = engines["vllm"][1]
    device = detect_device(env, space)
    model = resolve_models(opts, space, env)
    workload = resolve_workload(opts, model)
    slo = {"ttft_p95_ms": 2000.0, "e2e_p95_ms": 3000.0}  # the rag preset's
    ctx = TrialContext(engines, model, device, workload, LOG_DIR, progress, 300.0, slo)
    data = _load(out) or {
        "what": f"every config of search_spaces/{space_path.name}, measured once as a tuner trial plus the stress run",
        "space": space.model_dump(),
        "workload": {"name": workload.name, "digest": workload.digest(), "requests": len(workload.requests),
                     "concurrency": workload.concurrency, "seed": workload.seed},
        "engine": {"distribution": env.distribution, "version": env.version},
        "device": {"kind": device.kind, "name": device.name, "memory_bytes": device.memory_bytes},
        "model": {"path": model.path, "drafts": dict(model.drafts), "max_model_len": model.max_model_len},
        "machine": _report.machine(),
        "points": {},
    }  # fmt: skip
    # the engine default (no tuned flag) last: the baseline every study starts from
    points = shuffled(grid_points(space, grid_offers(space, model)), seed=0) + [{"engine": "vllm"}]
    todo = [p for p in points if not _current(data["points"].get(_key(p)))][:limit]
    progress.line(f"grid: {len(points)} configs, {len(data['points'])} done, {len(todo)} to measure now")
    offers = grid_offers(space, model)
    for i, point in enumerate(todo):
        # a point becomes a config as a trial's params do (``suggest`` on a fixed trial: a draft under its method)
        config = suggest(cast(optuna.Trial, optuna.trial.FixedTrial(point)), space, offers, point == {"engine": "vllm"})
        params = dict(config.params)
        started, load = time.time(), os.getloadavg()[0]
        result = run_trial(i, config, ctx, stress=True)
        data["points"][_key(point)] = {
            "order": i + len(points) - len(todo),
            "params": params,
            "argv": list(result.launch.argv),
            "failure": result.failure,
            "metrics": result.metrics,
            "server": result.server,
            "request_log": result.request_log,
            "stress": result.stress,
            "phases_s": result.phases_s,
            "wall_s": round(time.time() - started, 2),
            "boot_s": result.boot_s,
            "peak_memory_bytes": result.peak_memory_bytes,
            "memory_lines": _memory_lines(result.log_path),
            "log_tail": result.log_tail[-1500:] if result.failure else "",
            "load_avg_1m_before": load,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        }
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
        tmp.replace(out)  # atomic: an interrupted run never leaves a torn table
        outcome = result.failure or "served"
        progress.line(f"grid: {i + 1}/{len(todo)} {params} -> {outcome} in {time.time() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--space", type=Path, default=SPACE)
    args = parser.parse_args()
    measure(args.out, args.limit, args.space)


if __name__ == "__main__":
    main()
