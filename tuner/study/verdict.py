"""The finalists' verdict as stored on the study, and how it reads in one line."""

from __future__ import annotations

from typing import Any


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
