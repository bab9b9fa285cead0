"""The 95 % interval of repeated runs' figures, the finalists' verdict read from those intervals as
stored on the study, and how it reads in one line. The report reads a finalist's repeats here while
its stage still runs, as the search does when it ends (``tuner.search.finalists``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

# What stands for a 95 % interval over repeats too few to give one (``interval``).
TOO_FEW_RUNS = "too few runs for an interval"

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
    ``high`` are None and ``method`` says so; callers show ``TOO_FEW_RUNS``.
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


def intervals_overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two 95 % intervals (``low`` and ``high``) share any value: the repeats then cannot
    tell the two apart, whichever mean is higher."""
    return bool(a["low"] <= b["high"] and b["low"] <= a["high"])


def interval_text(stats: Mapping[str, Any], fmt: str = ".1f") -> str:
    """A finalist's ``mean [low, high]`` over its repeats, or its mean and why there is no interval."""
    mean = format(stats["mean"], fmt)
    if stats.get("low") is None or stats.get("high") is None:
        return f"{mean} ({TOO_FEW_RUNS})"
    return f"{mean} [{format(stats['low'], fmt)}, {format(stats['high'], fmt)}]"


def describe_verdict(verdict: dict[str, Any]) -> str:
    """The verdict in one line: on every metric it was reached on (a capacity-pareto study's verdict is
    one per tier, ``by_metric``; its top level repeats the first), then the stress check's failures."""
    failed = verdict.get("stress_failed") or []
    texts = dict.fromkeys(_verdict_text(v) for v in verdicts_by_metric(verdict).values())  # "sole" reads alike
    text = "verdict: " + "; ".join(texts)
    return text + (f"; failed the stress check: trials {', '.join(map(str, failed))}" if failed else "")


def verdicts_by_metric(verdict: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each metric's own verdict: ``by_metric`` where the stage judged several, else the verdict itself."""
    by_metric = verdict.get("by_metric")
    if isinstance(by_metric, dict) and by_metric:
        return {str(m): v for m, v in by_metric.items() if isinstance(v, dict)}
    return {str(verdict.get("metric")): dict(verdict)}


def _verdict_text(verdict: dict[str, Any]) -> str:
    trials = ", ".join(str(t) for t in verdict["trials"])
    if verdict["kind"] == "winner":
        return f"trial {trials} wins on {verdict['metric']} (its 95 % interval clears the runner-up's)"
    if verdict["kind"] == "sole":
        return f"trial {trials} is the only finalist that served all its repeats; nothing to compare"
    if verdict["kind"] == "tie":
        why = verdict.get("reason") or "their 95 % intervals overlap"
        return f"tie on {verdict['metric']} between trials {trials} ({why})"
    return "no finalist served all its repeats"
