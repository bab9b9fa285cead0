"""Noise: how much one config's trial score moves between fresh boots, and how many repeats that needs.

Run: ``.venv/bin/python -m tests.benchmarks.bench_noise [--repeats 5]`` (about 1.5 minutes per
repeat on 2 cores). Not part of the default test run.

The vLLM CPU default trial is run ``--repeats`` times exactly as ``tuner search --workload rag``
runs it: engines, device, model and workload resolved by ``tuner.search.run`` from the default search
space and default options (16 rag requests, seed 0, concurrency 4), and each repeat is
``tuner.measure.trial.run_trial`` with a fresh boot of the engine. Reported per repeat and over the
repeats: mean, sample standard deviation, coefficient of variation (CV) and the 95 % t-interval of
``ttft_p95_ms`` and ``output_throughput_tok_s``, then the number of finalist repeats that CV calls
for (AIPerf practice: 3 runs for a quick check, 5 standard; CV < 5 % is good, > 10 % needs more),
with the gap between two configs that 3 or 5 repeats can resolve under the project's rule (accept a
winner only when the 95 % t-intervals separate). ``--render-only`` re-derives the statistics and the
tables from the repeats already stored in ``reports/measurement.json``, without booting anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from typing import Any

import psutil

from tests.benchmarks import _engine, _report
from tuner.engines.base import Config
from tuner.measure.trial import TrialContext, TrialResult, run_trial
from tuner.progress import Progress
from tuner.search.run import SearchOptions, detect_device, resolve_engines, resolve_models, resolve_workload
from tuner.search.space import load_space

NAME = "noise"
METRICS = ("ttft_p95_ms", "output_throughput_tok_s")
EXTRA = ("ttft_p50_ms", "ttft_mean_ms", "e2e_p95_ms", "duration_s")
# two-sided 95 % Student t quantiles by degrees of freedom (no scipy in .venv)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}  # fmt: skip


def t95(df: int) -> float:
    return T95[max(k for k in T95 if k <= df)] if df < 30 else 1.96


class WatchingProgress(Progress):
    """Prints the trial's phases and, once the engine serves, remembers its process tree."""

    def __init__(self) -> None:
        super().__init__()
        self.tree: list[psutil.Process] = []

    def phase(self, trial: int, phase: str, detail: str = "") -> None:
        if phase == "warmup":  # the server and its workers are up: they are children of this process
            self.tree = psutil.Process(os.getpid()).children(recursive=True)
        super().phase(trial, phase, detail)


def stats(values: list[float]) -> dict[str, float]:
    n = len(values)
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if n > 1 else math.nan
    half = t95(n - 1) * std / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mean": mean, "std": std, "cv_pct": std / mean * 100 if mean else math.nan,
            "ci95_low": mean - half, "ci95_high": mean + half, "median": statistics.median(values),
            "min": min(values), "max": max(values)}  # fmt: skip


def repeats_for(cv_pct: float, target_pct: float = 5.0) -> int:
    """Fewest runs whose 95 % t-interval half-width is within ``target_pct`` of the mean, at this CV."""
    for n in range(2, 200):
        if t95(n - 1) * cv_pct / math.sqrt(n) <= target_pct:
            return n
    return 200


def separable_pct(cv_pct: float, n: int) -> float:
    """Smallest relative gap at which two configs' 95 % t-intervals (n runs each, this CV) stop overlapping.

    That is the project's rule for accepting a winner (reference/benchmarking.md): 2 t(n-1) CV / sqrt(n).
    """
    return 2 * t95(n - 1) * cv_pct / math.sqrt(n)


def recommend(worst_cv: float) -> tuple[int, str]:
    """The default finalist repeats for this CV, following AIPerf's practice, and why."""
    if worst_cv < 5.0:
        at3 = separable_pct(worst_cv, 3)
        return 3, f"CV below 5 % is good: AIPerf's quick check of 3 repeats already separates gaps of {at3:.0f} %"
    at5 = separable_pct(worst_cv, 5)
    if worst_cv <= 10.0:
        return 5, f"CV between 5 and 10 %: AIPerf's standard 5 repeats; winners separate from gaps of {at5:.0f} %"
    return 5, (
        f"CV above 10 % asks for more runs: a +-5 % interval needs {repeats_for(worst_cv)} repeats, at one "
        f"fresh boot each. 5 (AIPerf's standard) is kept as the default because the interval only shrinks as "
        f"1/sqrt(n) while the cost grows as n; with 5, winners separate from gaps of {at5:.0f} % "
        f"(3 repeats: {separable_pct(worst_cv, 3):.0f} %). The cheaper lever is a lower per-run CV: more "
        "requests per trial (a p95 over 16 requests rests on the top one or two) and a quiet machine"
    )


def summarize_repeats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Statistics over the successful repeats and the recommendation they lead to."""
    ok = [r for r in rows if r["failure"] is None]
    if len(ok) < 2:
        return {
            "summary": {},
            "worst_cv_pct": math.nan,
            "recommended_repeats": 0,
            "why": "fewer than 2 successful repeats",
            "repeats_for_5pct_interval": {},
            "separable_pct": {},
        }
    summary = {m: stats([r[m] for r in ok]) for m in (*METRICS, *EXTRA, "boot_s")}
    worst = max(summary[m]["cv_pct"] for m in METRICS)
    n_rec, why = recommend(worst)
    return {
        "summary": summary, "worst_cv_pct": worst, "recommended_repeats": n_rec, "why": why,
        "repeats_for_5pct_interval": {m: repeats_for(summary[m]["cv_pct"]) for m in METRICS},
        "separable_pct": {m: {str(n): separable_pct(summary[m]["cv_pct"], n) for n in (3, 5)} for m in METRICS},
    }  # fmt: skip


def run(repeats: int) -> dict[str, Any]:
    started = _report.stamp()
    machine_before = _report.machine()
    progress = WatchingProgress()
    opts = SearchOptions(workload="rag")
    space = load_space(opts.space)
    engines = resolve_engines(space, opts.engine_envs, ["vllm"], progress)
    env = engines["vllm"][1]
    device = detect_device(env, space)
    model = resolve_models(opts, space, env)
    workload = resolve_workload(opts, model)
    out = _engine.run_dir(NAME)
    ctx = TrialContext(engines, model, device, workload, out, progress)
    config = Config("vllm", {}, enforce_eager=space.static.enforce_eager, is_default=True)
    rows: list[dict[str, Any]] = []
    for i in range(repeats):
        load = os.getloadavg()[0]
        began = time.monotonic()  # not ``started``: that is the run's stamp
        result: TrialResult = run_trial(i, config, ctx)
        left = _engine.still_alive(progress.tree)
        rows.append(_row(i, result, load, time.monotonic() - began, left))
        print(f"repeat {i}: {rows[-1]}", flush=True)
    return {
        "stamp": started, "machine_before": machine_before, "machine_after": _report.machine(),
        "engine_version": env.version, "workload_digest": workload.digest(), "device": device.name,
        "workload": workload.description, "requests": len(workload.requests),
        "concurrency": workload.concurrency, "argv": list(rows[0]["argv"]) if rows else [],
        "logs": str(out.relative_to(_report.ROOT)), "repeats": rows, **summarize_repeats(rows),
    }  # fmt: skip


def _row(i: int, result: TrialResult, load: float, wall_s: float, left: list[str]) -> dict[str, Any]:
    m = result.metrics
    return {
        "repeat": i, "failure": result.failure, "boot_s": result.boot_s, "wall_s": wall_s, "loadavg_1m": load,
        **{k: m.get(k, math.nan) for k in (*METRICS, *EXTRA)},
        "server_ttft_mean_ms": result.server.get("server_ttft_mean_ms"),
        "prefix_cache_hit_rate": result.server.get("prefix_cache_hit_rate"),
        "warnings": list(getattr(result, "warnings", [])), "argv": list(result.launch.argv),
        "processes_left": left,
    }  # fmt: skip


def markdown(data: dict[str, Any], title: str = "## Noise across fresh boots (`bench_noise`)") -> str:
    rows = [[r["repeat"], r["failure"] or "ok", r["boot_s"], r["loadavg_1m"], r["ttft_p95_ms"], r["ttft_p50_ms"],
             r["ttft_mean_ms"], r["server_ttft_mean_ms"], r["output_throughput_tok_s"], r["prefix_cache_hit_rate"],
             len(r["processes_left"])] for r in data["repeats"]]  # fmt: skip
    s = data["summary"]
    sep = data["separable_pct"]
    summary_rows = [
        [m, s[m]["mean"], s[m]["std"], f"{s[m]['cv_pct']:.1f}", f"{s[m]['ci95_low']:.1f}-{s[m]['ci95_high']:.1f}",
         s[m]["median"], f"{s[m]['min']:.1f}-{s[m]['max']:.1f}", data["repeats_for_5pct_interval"].get(m, ""),
         f"{sep[m]['3']:.0f} / {sep[m]['5']:.0f}" if m in sep else ""]
        for m in (*METRICS, *EXTRA, "boot_s") if m in s
    ]  # fmt: skip
    m0, m1 = data["machine_before"], data["machine_after"]
    return "\n\n".join(
        [
            title,
            f"The vLLM {data['engine_version']} default trial as `tuner search --workload rag` "
            f"runs it ({data['workload']}; {data['requests']} requests), {len(data['repeats'])} fresh-boot repeats "
            f"through `tuner.measure.trial.run_trial`. Logs: `{data['logs']}`. {_report.contention(m0, m1)}",
            _report.table(
                [
                    "repeat",
                    "result",
                    "boot s",
                    "load 1m",
                    "TTFT p95 ms",
                    "TTFT p50 ms",
                    "TTFT mean ms",
                    "server TTFT mean ms",
                    "out tok/s",
                    "prefix hit rate",
                    "procs left",
                ],
                rows,
            ),  # fmt: skip
            _report.table(
                [
                    "metric",
                    "mean",
                    "std",
                    "CV %",
                    "95 % t-interval",
                    "median",
                    "min-max",
                    "runs for +-5 % interval",
                    "gap % separable at 3 / 5 runs",
                ],
                summary_rows,
            ),  # fmt: skip
            f"Worst CV of the two objectives: {data['worst_cv_pct']:.1f} %. Recommended default finalist repeats: "
            f"**{data['recommended_repeats']}** ({data['why']}).",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="re-derive the statistics and the table from the repeats stored in reports/, no run",
    )
    args = parser.parse_args()
    if args.render_only:
        data = json.loads(_report.JSON_PATH.read_text())[NAME]
        data.update(summarize_repeats(data["repeats"]))
    else:
        data = run(args.repeats)
    text = markdown(data)
    _report.write_section(NAME, text, data)
    print(text)


if __name__ == "__main__":
    main()
