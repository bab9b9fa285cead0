"""Finalist repeats: the best configs run again on fresh boots before a winner is declared.

After the search, the top ``finalists`` feasible configs (Pareto-optimal first, ranked by the
deciding metric: goodput under the SLOs where there are SLOs, output throughput otherwise), plus the
engine default as the reference, each run ``repeats`` more times, every time on a fresh boot. For
every objective the tuner reports the mean, the 95 % Student-t interval and the coefficient of
variation. The best config is declared the winner only when its interval on the deciding metric
lies wholly above the runner-up's; otherwise the verdict is a tie that names both. Results live in
the study's ``finalists`` and ``verdict`` user attributes (shown by optuna-dashboard, ``tuner
trials`` and every export). Running them is ``tuner.finalists``; this module holds the statistics.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import optuna

from tuner.engines.base import Config
from tuner.feasible import feasible_pareto, feasible_trials
from tuner.study import DEFAULT_KIND

# Two-sided 95 % Student-t quantiles by degrees of freedom; beyond 30 the normal 1.96 is close enough.
T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
REPORTED = ("ttft_p95_ms", "tpot_p95_ms", "output_throughput_tok_s", "goodput_req_s")


def interval(samples: Sequence[float]) -> dict[str, float]:
    """Mean, 95 % t-interval and CV of the samples (the interval is a point for one sample)."""
    n = len(samples)
    mean = statistics.fmean(samples)
    sd = statistics.stdev(samples) if n > 1 else 0.0
    half = T975.get(n - 1, 2.042 if n <= 31 else 1.96) * sd / math.sqrt(n) if n > 1 else 0.0
    return {"n": n, "mean": mean, "low": mean - half, "high": mean + half, "cv": sd / mean if mean else math.nan}


def decider(study: optuna.Study) -> str:
    return "goodput_req_s" if study.user_attrs.get("slo") else "output_throughput_tok_s"


def pick_finalists(study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The k best feasible tuned configs (Pareto-optimal first), then the engine default."""
    key = decider(study)
    front = {t.number for t in feasible_pareto(study)}
    feasible = feasible_trials(study)
    tuned = [t for t in feasible if t.user_attrs.get("config_kind") != DEFAULT_KIND]
    chosen = sorted(
        tuned, key=lambda t: (t.number not in front, -float(t.user_attrs.get("metrics", {}).get(key) or 0.0))
    )
    return chosen[:k] + [t for t in feasible if t.user_attrs.get("config_kind") == DEFAULT_KIND]


def config_of(trial: optuna.trial.FrozenTrial, enforce_eager: bool) -> Config:
    attrs = trial.user_attrs
    is_default = attrs.get("config_kind") == DEFAULT_KIND
    return Config(attrs["engine"], dict(attrs.get("config", {})), enforce_eager, is_default)


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
    best, runner_up = ranked[0], ranked[1]
    enough = min(best["stats"][key]["n"], runner_up["stats"][key]["n"]) >= 2  # one run has no interval
    separated = enough and best["stats"][key]["low"] > runner_up["stats"][key]["high"]
    return {"kind": "winner" if separated else "tie", "metric": key,
            "trials": [best["trial"]] if separated else [best["trial"], runner_up["trial"]]}  # fmt: skip


def describe_verdict(verdict: dict[str, Any]) -> str:
    failed = verdict.get("stress_failed") or []
    text = _verdict_text(verdict)
    return text + (f"; failed the stress check: trials {', '.join(map(str, failed))}" if failed else "")


def _verdict_text(verdict: dict[str, Any]) -> str:
    trials = ", ".join(str(t) for t in verdict["trials"])
    if verdict["kind"] == "winner":
        return f"verdict: trial {trials} wins on {verdict['metric']} (its 95 % interval clears the runner-up's)"
    if verdict["kind"] == "sole":
        return f"verdict: trial {trials} is the only finalist that served all its repeats; nothing to compare"
    if verdict["kind"] == "tie":
        return f"verdict: tie on {verdict['metric']} between trials {trials} (their 95 % intervals overlap)"
    return "verdict: no finalist served all its repeats"
