"""The 95 % interval of repeated runs' figures, the finalists' verdict judged on those intervals (as
the search stores it, and read again from a study's stored repeats), and how it reads in one line.
The report reads a finalist's repeats here while its stage still runs, as the search does when it
ends (``tuner.search.finalists``)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.study.attrs import tier_bracket_top

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


def repeat_interval(runs: Sequence[Mapping[str, Any]], metric: str) -> dict[str, Any] | None:
    """``interval`` of the served repeats' ``metric``, or None where none served it.

    A capacity is a rung of the search's ladder, not a point: each repeat's capacity lies in its
    bracket, at or above its claim and below the lowest rate above it that did not pass. Repeats on
    the same rung have no spread, and the claims' interval shrinks to that rung, a certainty no
    measurement gave. The true capacities exceed the claims by an unknown part of each bracket, at
    most its width, so a capacity's interval keeps the claims' low and raises their high by the
    brackets' mean width (a factor, on the log scale of ``interval``): it holds the mean wherever in
    its bracket each repeat's capacity lies. A repeat stored without its search (before repeats kept
    it), or whose search stopped before a rate above its claim failed, raises nothing. The mean stays
    the claims'."""
    served = [r for r in runs if r.get("failure") is None and metric in (r.get("metrics") or {})]
    if not served:
        return None
    claims = [float(r["metrics"][metric]) for r in served]
    out = interval(claims)
    tops = [max(claim, _bracket_top(r, metric) or claim) for r, claim in zip(served, claims, strict=True)]
    if out["high"] is None or tops == claims:  # too few runs, or not a capacity, or no bracket kept
        return out
    if out["method"] == LOG_T:
        reach = math.exp(statistics.fmean(math.log(top / claim) for top, claim in zip(tops, claims, strict=True)))
        high = out["high"] * reach
    else:
        high = out["high"] + statistics.fmean(top - claim for top, claim in zip(tops, claims, strict=True))
    return out | {"high": high, "method": f"{out['method']}, raised by the brackets' mean width"}


def repeat_stats(runs: Sequence[Mapping[str, Any]], metrics: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each of ``metrics``' interval over the served repeats (``repeat_interval``), where any served it:
    a finalist's stats, as the search stores them when its stage ends and as ``reread`` reads them again."""
    return {m: stats for m in metrics if (stats := repeat_interval(runs, m)) is not None}


def _bracket_top(run: Mapping[str, Any], metric: str) -> float | None:
    """The top of the bracket a repeat's capacity ``metric`` was claimed in (``capacity_req_s`` is the
    objective tier's), or None for any other metric and for a repeat that kept no search."""
    capacity = run.get("capacity")
    if not metric.startswith("capacity_") or not isinstance(capacity, Mapping):
        return None
    tier = capacity.get("objective_tier") if metric == "capacity_req_s" else metric[len("capacity_") : -len("_req_s")]
    return tier_bracket_top((capacity.get("tiers") or {}).get(tier) or {})  # None too where no rate above failed


def intervals_overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two 95 % intervals (``low`` and ``high``) share any value: the repeats then cannot
    tell the two apart, whichever mean is higher. Bounds equal but for rounding touch: a capacity
    interval raised to a rung (``repeat_interval``) meets the next finalist's claims there."""
    return bool(_at_most(a["low"], b["high"]) and _at_most(b["low"], a["high"]))


def _at_most(x: float, y: float) -> bool:
    return x <= y or _close(x, y)


def _close(x: float, y: float) -> bool:
    """Two bounds equal but for rounding (a raised bound is a product of exp and log)."""
    return math.isclose(x, y, rel_tol=1e-9)


def judge(finalists: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The winner when its interval separates from the runner-up's; a tie otherwise."""
    ranked = sorted(
        (f for f in finalists if not f["failures"] and key in f["stats"]),
        key=lambda f: -f["stats"][key]["mean"],
    )
    if not ranked:
        return {"kind": "none", "metric": key, "trials": []}
    if len(ranked) == 1:
        return {"kind": "sole", "metric": key, "trials": [ranked[0]["trial"]]}
    best, runner_up = ranked[0]["stats"][key], ranked[1]["stats"][key]
    if best.get("low") is None or runner_up.get("low") is None:  # too few runs: no interval to separate
        return {"kind": "tie", "metric": key, "trials": [ranked[0]["trial"], ranked[1]["trial"]],
                "reason": TOO_FEW_RUNS}  # fmt: skip
    separated = not intervals_overlap(best, runner_up)
    return {"kind": "winner" if separated else "tie", "metric": key,
            "trials": [ranked[0]["trial"]] if separated else [ranked[0]["trial"], ranked[1]["trial"]]}  # fmt: skip


def verdict_of(
    finalists: Sequence[dict[str, Any]], keys: Sequence[str], stress_failed: Iterable[int]
) -> dict[str, Any]:
    """The finalists' verdict as the study stores it: on the first deciding metric, and on each where
    there are several (``by_metric``, a capacity-pareto study's tiers); a finalist that failed its
    stress check is not judged."""
    failed = sorted(set(stress_failed))
    judged = [f for f in finalists if f["trial"] not in failed]
    verdict = judge(judged, keys[0])
    if len(keys) > 1:
        verdict["by_metric"] = {key: judge(judged, key) for key in keys}
    return verdict | {"stress_failed": failed}


def reread(attrs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored finalists and verdict read again from their stored repeats with this version's
    intervals (``repeat_interval``), where that changes a finalist's interval: ``{"finalists",
    "verdict"}``, else None. A study whose finalists ran at an older tag (a GPU study runs at its tag
    across leases) stored intervals of the claims alone, and its verdict was judged on them."""
    stored, verdict = attrs.get("finalists"), attrs.get("verdict")
    runs = attrs.get("finalist_runs") or {}
    if not isinstance(stored, list) or not isinstance(verdict, dict) or not runs:
        return None
    again = []
    for f in stored:
        own = runs.get(str(f["trial"])) or []
        served = any(r.get("failure") is None for r in own)
        again.append({**f, "stats": repeat_stats(own, f.get("stats") or {})} if served else f)
    if all(_same(f.get("stats") or {}, a.get("stats") or {}) for f, a in zip(stored, again, strict=True)):
        return None
    keys = list(verdicts_by_metric(verdict))
    return {"finalists": again, "verdict": verdict_of(again, keys, verdict.get("stress_failed") or [])}


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether two finalists' stats hold the same intervals (bounds equal but for rounding)."""

    def bound(x: Any, y: Any) -> bool:
        return x is None and y is None or x is not None and y is not None and _close(x, y)

    return a.keys() == b.keys() and all(bound(a[m].get(k), b[m].get(k)) for m in a for k in ("low", "high"))


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
