"""The finalists' verdict as stored on the study, and how it reads in one line."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# What stands for a 95 % interval over repeats too few to give one (``tuner.measure.statistics.interval``).
TOO_FEW_RUNS = "too few runs for an interval"


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
        why = verdict.get("reason") or "their 95 % intervals overlap"
        return f"verdict: tie on {verdict['metric']} between trials {trials} ({why})"
    return "verdict: no finalist served all its repeats"
