"""95 % intervals for one trial's figures, from the trial's own requests.

A single run's percentile or throughput is an estimate: another run of the same config would give
another number. Without repeating the trial, its requests bound how far off it may be:

* latency percentiles (TTFT p50/p95, TPOT p95, end-to-end p95): a percentile bootstrap over the
  successful requests (``BOOTSTRAP`` resamples, seeded, so the interval is reproducible);
* output throughput: batch means, since throughput is a property of the run rather than of any
  request: the run is cut into ``BATCHES`` consecutive slices of completed requests, the throughput
  of each slice is taken, and ``tuner.study.verdict.interval`` (a t-interval on the log scale) is put on
  their mean;
* ``good_fraction``: the Wilson score interval of good requests over all sent.

The finalists' repeats give the between-run intervals (``tuner.search.finalists``); these are the within-run
ones, stored on every trial as ``ci`` and shown in optuna-dashboard and in exports.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuner.study.verdict import interval

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
