"""The serving phases of a trial on a server that is up: warmup, cache reset, the measured
workload, the stress run; and what the server says about itself (``/metrics``, ``/v1/models``)."""

from __future__ import annotations

import math
import time
from typing import Any

import httpx

from tuner.driver import DriveResult, drive_sync
from tuner.engines.base import EngineAdapter
from tuner.failures import classify_serve
from tuner.goodput import goodput, steady_throughput
from tuner.metrics import parse_prometheus, request_log, summarize
from tuner.outcome import MAX_ERROR_RATE, TTFT_AGREEMENT, TrialContext, TrialResult, WatchFactory
from tuner.process import ServerProcess, tail
from tuner.pruning import Pruned
from tuner.stress import VERSION, peak_concurrency, stress_requests


def scrape_metrics(client: httpx.Client, base_url: str) -> dict[str, float]:
    try:
        response = client.get(base_url + "/metrics")
        return parse_prometheus(response.text) if response.status_code == 200 else {}
    except httpx.HTTPError:
        return {}


def identify_server(client: httpx.Client, base_url: str) -> dict[str, Any]:
    """What really serves: the model list and version the server reports, not the sampled engine."""
    found: dict[str, Any] = {}
    try:
        models = client.get(base_url + "/v1/models").json().get("data", [])
        found["models"] = [m.get("id") for m in models]
        found["owned_by"] = sorted({str(m.get("owned_by")) for m in models})
        found["version"] = client.get(base_url + "/version").json().get("version")
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return found


def serve_workload(
    number: int, server: ServerProcess, adapter: EngineAdapter, ctx: TrialContext, result: TrialResult,
    watch: WatchFactory | None,
) -> None:  # fmt: skip
    workload, spec = ctx.workload, server.spec
    ready_at = server.log_size()
    with httpx.Client(timeout=10.0) as client:
        result.served_by = identify_server(client, server.base_url)
        ctx.progress.phase(number, "warmup", f"{len(workload.warmup)} requests, boot {result.boot_s:.0f} s")
        started = time.monotonic()
        drive_sync(None, server.base_url, spec.served_model, workload.warmup, concurrency=workload.concurrency)
        result.phases_s["warmup"] = round(time.monotonic() - started, 2)
        if not reset_prefix_cache(client, server, adapter):
            result.warnings.append("prefix cache not reset after warmup: the workload may start warm")
        before = scrape_metrics(client, server.base_url)
        ctx.progress.phase(number, "drive", f"{len(workload.requests)} requests at concurrency {workload.concurrency}")
        on_record = watch(len(workload.requests), result.boot_s or 0.0) if watch is not None else None
        started = time.monotonic()
        try:
            drove = drive_sync(
                None, server.base_url, spec.served_model, workload.requests,
                concurrency=workload.concurrency, on_record=on_record,
            )  # fmt: skip
        except Pruned as stop:
            result.pruned, result.phases_s["drive"] = stop.info, round(time.monotonic() - started, 2)
            ctx.progress.phase(number, "pruned", str(stop))
            return
        result.phases_s["drive"] = round(drove.ended_s - drove.started_s, 2)
        after = scrape_metrics(client, server.base_url)
        alive = server.alive() and healthy(client, server)
    _score(result, drove, adapter.server_stats(before, after) if after else {}, ctx)
    since_ready = tail(server.log_path, max_lines=400, start=ready_at)
    result.failure = classify_serve(since_ready, alive, result.metrics["error_rate"], MAX_ERROR_RATE)
    m = result.metrics
    score = f"ttft_p95={m['ttft_p95_ms']:.0f} ms  throughput={m['output_throughput_tok_s']:.1f} tok/s"
    if result.failure is not None:
        score = f"failed: {result.failure}"
    ctx.progress.phase(number, "score", score)


def _score(result: TrialResult, drove: DriveResult, server_stats: dict[str, Any], ctx: TrialContext) -> None:
    """The drive's metrics, goodput at the SLO, samples and request log, beside the server's own."""
    result.metrics = summarize(drove) | goodput(drove, ctx.slo)
    result.metrics["steady_output_throughput_tok_s"] = steady_throughput(drove)
    result.ttft_samples_ms = sorted(
        round((r.first_token_s - r.sent_s) * 1e3, 2) for r in drove.records if r.error is None and r.first_token_s
    )
    result.request_log = request_log(drove)
    result.server = server_stats
    result.warnings += clock_warnings(result)


def stress_run(
    number: int, server: ServerProcess, adapter: EngineAdapter, ctx: TrialContext, result: TrialResult
) -> None:
    """The workload's longest request at its peak concurrency, cold cache (``tuner.stress``); the
    raw outcome goes to ``result.stress`` and is judged by the caller, who knows the default's."""
    requests, peak = stress_requests(ctx.workload), peak_concurrency(ctx.workload)
    mark = server.log_size()
    with httpx.Client(timeout=10.0) as client:
        reset = reset_prefix_cache(client, server, adapter)
        what = f"{len(requests)} x {requests[0].prompt_tokens} prompt tokens at concurrency {peak}, cold cache"
        ctx.progress.phase(number, "stress", what)
        drove = drive_sync(None, server.base_url, server.spec.served_model, requests, concurrency=peak)
        alive = server.alive() and healthy(client, server)
    result.phases_s["stress"] = round(drove.ended_s - drove.started_s, 2)
    result.stress = {
        "metrics": summarize(drove),
        "alive": alive,
        "killed": server.returncode() in (-9, 137),
        "cache_reset": reset,
        "version": VERSION,
        "concurrency": peak,
        "prompt_tokens": requests[0].prompt_tokens,
        "log": tail(server.log_path, max_lines=200, start=mark),
        "request_log": request_log(drove),
    }


def reset_prefix_cache(client: httpx.Client, server: ServerProcess, adapter: EngineAdapter) -> bool:
    """Empty the prefix cache the warmup filled, so every trial starts equally cold."""
    if adapter.reset_cache_path is None:
        return False
    try:
        return client.post(server.base_url + adapter.reset_cache_path).status_code == 200
    except httpx.HTTPError:
        return False


def clock_warnings(result: TrialResult) -> list[str]:
    """Compare the client's mean TTFT with the server's own histogram mean over the same requests."""
    server_ms, client_ms = result.server.get("server_ttft_mean_ms"), result.metrics.get("ttft_mean_ms")
    if server_ms is None or client_ms is None or not math.isfinite(client_ms) or server_ms <= 0:
        return []
    gap = abs(client_ms - server_ms) / server_ms
    result.metrics["ttft_client_vs_server_pct"] = 100.0 * (client_ms - server_ms) / server_ms
    if gap <= TTFT_AGREEMENT:
        return []
    return [f"client mean TTFT {client_ms:.0f} ms differs from the server's {server_ms:.0f} ms by {gap:.0%}"]


def healthy(client: httpx.Client, server: ServerProcess) -> bool:
    try:
        return client.get(server.base_url + server.spec.health_path).status_code == 200
    except httpx.HTTPError:
        return False
