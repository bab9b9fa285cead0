"""95 % intervals for one trial's figures, from the trial's own requests.

A single run's percentile or throughput is an estimate: another run of the same config would give
another number. Without repeating the trial, its requests bound how far off it may be:

* latency percentiles (TTFT p50/p95, TPOT p95, end-to-end p95): a percentile bootstrap over the
  successful requests (``BOOTSTRAP`` resamples, seeded, so the interval is reproducible);
* output throughput: batch means, since throughput is a property of the run rather than of any
  request: the run is cut into ``BATCHES`` consecutive slices of completed requests, the throughput
  of each slice is taken, and ``interval`` (a t-interval on the log scale) is put on their mean;
* ``good_fraction``: the Wilson score interval of good requests over all sent.

The finalists' repeats give the between-run intervals (``tuner.search.finalists``); these are the within-run
ones, stored on every trial as ``ci`` and shown in optuna-dashboard and in exports.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuner.study.verdict import TOO_FEW_RUNS

BOOTSTRAP = 1000
BATCHES = 4
Z95 = 1.959964


def _percentile_ci(values: Sequence[float], q: float, seed: int = 0) -> tuple[float, float] | None:
    if len(values) < 5:
        return None
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    draws = np.percentile(rng.choice(data, size=(BOOTSTRAP, len(data)), replace=True), q, axis=1)
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(low), float(high)


def wilson(good: int, total: int) -> tuple[float, float] | None:
    if total == 0:
        return None
    p, n = good / total, total
    centre = (p + Z95**2 / (2 * n)) / (1 + Z95**2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95**2 / (4 * n * n)) / (1 + Z95**2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _throughput_ci(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float] | None:
    done = sorted((r for r in rows if r["error"] is None and r["done_s"] is not None), key=lambda r: r["done_s"])
    if len(done) < 2 * BATCHES:
        return None
    size, start, rates = len(done) // BATCHES, 0.0, []
    for b in range(BATCHES):
        chunk = done[b * size : (b + 1) * size] if b < BATCHES - 1 else done[b * size :]
        end = chunk[-1]["done_s"]
        rates.append(sum(r["output_tokens"] for r in chunk) / (end - start) if end > start else 0.0)
        start = end
    stats = interval(rates)
    return (stats["low"], stats["high"]) if stats["low"] is not None else None


def trial_intervals(rows: Sequence[Mapping[str, Any]], metrics: Mapping[str, float]) -> dict[str, dict[str, Any]]:
    """The ``ci`` attribute of a trial from its ``request_log`` rows (see the module docstring)."""
    ok = [r for r in rows if r["error"] is None and r["first_s"] is not None and r["done_s"] is not None]
    ttft = [(r["first_s"] - r["sent_s"]) * 1e3 for r in ok]
    e2e = [(r["done_s"] - r["sent_s"]) * 1e3 for r in ok]
    tpot = [(r["done_s"] - r["first_s"]) * 1e3 / (r["output_tokens"] - 1) for r in ok if r["output_tokens"] > 1]
    found = {
        "ttft_p50_ms": (_percentile_ci(ttft, 50), "bootstrap"),
        "ttft_p95_ms": (_percentile_ci(ttft, 95), "bootstrap"),
        "tpot_p95_ms": (_percentile_ci(tpot, 95), "bootstrap"),
        "e2e_p95_ms": (_percentile_ci(e2e, 95), "bootstrap"),
        "output_throughput_tok_s": (_throughput_ci(rows), f"batch means over {BATCHES} slices"),
    }
    if "good_fraction" in metrics and rows:
        good = round(metrics["good_fraction"] * len(rows))
        found["good_fraction"] = (wilson(good, len(rows)), "Wilson")
    return {k: {"low": ci[0], "high": ci[1], "method": how} for k, (ci, how) in found.items() if ci is not None}


# Two-sided 95 % Student-t quantiles by degrees of freedom; beyond 30 the normal 1.96 is close enough.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
        20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064, 25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048,
        29: 2.045, 30: 2.042}  # fmt: skip
# Two runs give a t quantile of 12.7 and a spread guessed from one difference: no interval worth showing.
MIN_RUNS = 3
LOG_T = "t on the log scale"
CLIPPED_T = "t, clipped at 0"


def interval(samples: Sequence[float]) -> dict[str, Any]:
    """Mean, coefficient of variation and 95 % interval of repeated runs' figures (``n`` of them).

    Latency and throughput are positive and right-skewed, and there are few runs, so the interval is
    a Student-t interval on the log scale (around the geometric mean, multiplicative): never negative,
    longer above than below. Samples with a zero in them (a run that served nothing good) have no log:
    they take the plain t-interval, clipped at 0. With fewer than ``MIN_RUNS`` samples, ``low`` and
    ``high`` are None and ``method`` says so; callers show ``tuner.study.verdict.TOO_FEW_RUNS``.
    """
    n = len(samples)
    mean = statistics.fmean(samples)
    sd = statistics.stdev(samples) if n > 1 else 0.0
    out: dict[str, Any] = {"n": n, "mean": mean, "low": None, "high": None,
                           "cv": sd / mean if mean else math.nan, "method": TOO_FEW_RUNS}  # fmt: skip
    if n < MIN_RUNS:
        return out
    t = T975.get(n - 1, 1.96)
    if min(samples) > 0:
        logs = [math.log(x) for x in samples]
        centre, half = statistics.fmean(logs), t * statistics.stdev(logs) / math.sqrt(n)
        return out | {"low": math.exp(centre - half), "high": math.exp(centre + half), "method": LOG_T}
    half = t * sd / math.sqrt(n)
    return out | {"low": max(0.0, mean - half), "high": mean + half, "method": CLIPPED_T}
