"""Goodput under SLOs, and throughput over the steady-state window.

SLOs are named after the percentile they bound (``ttft_p95_ms=500``), and each request is judged
against every bound (DistServe's goodput): a request is *good* when it succeeded and its TTFT,
TPOT and end-to-end time are within their bounds. ``good_fraction`` = good requests / all requests
sent, errors included, so a config that sheds load never looks good. ``goodput_req_s`` = good
requests / run duration.

The steady-state window is the longest span in which at least ``STEADY_SHARE`` of the peak number
of requests were in flight (SGLang's definition), which drops ramp-up and drain; throughput there
counts the output tokens whose chunks arrived inside the window.
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner.client.driver import DriveResult, RequestRecord
from tuner.errors import ConfigError

SLO_KEYS = ("ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms")
STEADY_SHARE = 0.8


def parse_slo(text: str) -> dict[str, float]:
    """``ttft_p95_ms=500,tpot_p95_ms=50`` → a dict; anything else is a ConfigError naming the part."""
    slo: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in SLO_KEYS:
            raise ConfigError(f"--slo {part!r}: expected KEY=MILLISECONDS with KEY one of {', '.join(SLO_KEYS)}")
        try:
            bound = float(value)
        except ValueError as exc:
            raise ConfigError(f"--slo {part!r}: {value!r} is not a number") from exc
        if not bound > 0 or bound == float("inf"):
            raise ConfigError(f"--slo {part!r}: the bound must be a positive, finite number of milliseconds")
        slo[key.strip()] = bound
    return slo


def _request_ok(record: RequestRecord, slo: Mapping[str, float]) -> bool:
    if record.error is not None or record.first_token_s is None or record.done_s is None:
        return False
    ttft_ms = (record.first_token_s - record.sent_s) * 1e3
    e2e_ms = (record.done_s - record.sent_s) * 1e3
    tpot_ms = (e2e_ms - ttft_ms) / (record.output_tokens - 1) if record.output_tokens > 1 else 0.0
    measured = {"ttft_p95_ms": ttft_ms, "tpot_p95_ms": tpot_ms, "e2e_p95_ms": e2e_ms}
    return all(measured[key] <= bound for key, bound in slo.items())


def goodput(result: DriveResult, slo: Mapping[str, float]) -> dict[str, float]:
    sent = len(result.records)
    good = sum(_request_ok(r, slo) for r in result.records)
    duration = result.ended_s - result.started_s
    return {
        "good_fraction": good / sent if sent else 0.0,
        "goodput_req_s": good / duration if duration > 0 else 0.0,
    }


def steady_window(result: DriveResult) -> tuple[float, float] | None:
    """The longest span with at least STEADY_SHARE of the peak in flight, or None without requests."""
    events = sorted(
        [(r.sent_s, 1) for r in result.records] + [(r.done_s or result.ended_s, -1) for r in result.records]
    )
    if not events:
        return None
    level, levels = 0, []
    for at, step in events:
        level += step
        levels.append((at, level))
    floor = STEADY_SHARE * max(lv for _, lv in levels)
    best, start = (0.0, 0.0), None
    for at, lv in levels:
        if lv >= floor and start is None:
            start = at
        elif lv < floor and start is not None:
            best = max(best, (at - start, start), key=lambda span: span[0])
            start = None
    return (best[1], best[1] + best[0]) if best[0] > 0 else None


def steady_throughput(result: DriveResult) -> float:
    window = steady_window(result)
    if window is None:
        return 0.0
    lo, hi = window
    tokens = sum(
        n
        for r in result.records
        if r.error is None
        for at, n in zip(r.token_times_s, r.chunk_tokens, strict=False)
        if lo <= at <= hi
    )
    return tokens / (hi - lo)
