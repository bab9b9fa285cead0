"""Trial metrics from driver records, and samples from a server's Prometheus ``/metrics`` page.

Definitions follow vLLM's ``benchmark_serving`` so numbers compare with published ones:

- TTFT: first streamed chunk carrying text minus send time.
- E2E latency: last byte minus send time.
- TPOT, per request: ``(e2e - ttft) / (output_tokens - 1)``, only for requests with >= 2 output
  tokens; percentiles are taken over requests.
- ITL: gaps between consecutive text chunks, pooled over all requests. A chunk that carried ``n``
  tokens contributes ``n`` gaps of ``gap / n``, so servers that batch tokens per chunk are not
  rewarded with fewer, longer gaps.
- Output throughput: output tokens of successful requests / (end - start of the whole run);
  request throughput likewise counts successful requests.

Latency percentiles use numpy's linear interpolation over successful requests only; a failed
request counts in ``error_rate``. With no success, latency keys are NaN and throughputs 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import httpx
import numpy as np

from tuner.client.driver import DriveResult, RequestRecord
from tuner.engines.prometheus import parse_prometheus

MAX_ERROR_RATE = 0.005  # the share of a run's requests that may fail: above it a trial (or stress run) failed


def summarize(result: DriveResult) -> dict[str, float]:
    """The trial's summary metrics (see the module docstring for definitions); all values float."""
    records = result.records
    ok = [r for r in records if r.error is None and r.done_s is not None]
    n_errors = len(records) - len(ok)
    duration_s = result.ended_s - result.started_s
    output_total = sum(r.output_tokens for r in ok)
    summary = {
        "n_requests": float(len(records)),
        "n_errors": float(n_errors),
        "error_rate": n_errors / len(records) if records else 0.0,
        "duration_s": duration_s,
        "output_tokens_total": float(output_total),
        "prompt_tokens_total": float(sum(r.prompt_tokens for r in ok)),
        "output_throughput_tok_s": output_total / duration_s if ok and duration_s > 0 else 0.0,
        "request_throughput_req_s": len(ok) / duration_s if ok and duration_s > 0 else 0.0,
    }
    ttft_ms = [(r.first_token_s - r.sent_s) * 1e3 for r in ok if r.first_token_s is not None]
    e2e_ms = [(r.done_s - r.sent_s) * 1e3 for r in ok if r.done_s is not None]
    summary.update(_percentiles("ttft", ttft_ms, (50, 90, 95, 99)))
    summary["ttft_mean_ms"] = float(np.mean(ttft_ms)) if ttft_ms else math.nan
    summary.update(_percentiles("tpot", [t for r in ok if (t := _tpot_ms(r)) is not None], (50, 95)))
    summary.update(_percentiles("itl", [gap for r in ok for gap in itl_ms(r)], (50, 95)))
    summary.update(_percentiles("e2e", e2e_ms, (50, 95)))
    return summary


def request_row(r: RequestRecord, started_s: float) -> dict[str, Any]:
    """One request as a small row, times in seconds after ``started_s``."""
    return {
        "sent_s": round(r.sent_s - started_s, 4),
        "first_s": None if r.first_token_s is None else round(r.first_token_s - started_s, 4),
        "done_s": None if r.done_s is None else round(r.done_s - started_s, 4),
        "output_tokens": r.output_tokens,
        "prompt_tokens": r.prompt_tokens,
        "error": r.error,
    }


def request_log(drove: DriveResult) -> list[dict[str, Any]]:
    """One row per request: enough to recompute any percentile, goodput under other SLOs, or the
    running metrics a pruner saw (``tuner.search.pruning``)."""
    return [request_row(r, drove.started_s) for r in drove.records]


def _percentiles(prefix: str, values_ms: Sequence[float], qs: Sequence[int]) -> dict[str, float]:
    if not values_ms:
        return {f"{prefix}_p{q}_ms": math.nan for q in qs}
    points = np.percentile(np.asarray(values_ms, dtype=float), qs)
    return {f"{prefix}_p{q}_ms": float(v) for q, v in zip(qs, points, strict=True)}


def _tpot_ms(record: RequestRecord) -> float | None:
    if record.output_tokens < 2 or record.first_token_s is None or record.done_s is None:
        return None
    return (record.done_s - record.first_token_s) * 1e3 / (record.output_tokens - 1)


def itl_ms(record: RequestRecord) -> list[float]:
    times, tokens = record.token_times_s, record.chunk_tokens
    gaps: list[float] = []
    for i in range(1, len(times)):
        n = max(tokens[i], 1) if i < len(tokens) else 1
        gaps.extend([(times[i] - times[i - 1]) * 1e3 / n] * n)
    return gaps


def scrape_metrics(client: httpx.Client, base_url: str) -> dict[str, float]:
    try:
        response = client.get(base_url + "/metrics")
        return parse_prometheus(response.text) if response.status_code == 200 else {}
    except httpx.HTTPError:
        return {}
