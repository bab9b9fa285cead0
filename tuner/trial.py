"""One trial end to end: boot the engine, warm up, drive the workload, score, stop.

Every path out of ``run_trial`` stops the server's whole process group (``ServerProcess``), and a
failure becomes a ``TrialResult`` with a failure class rather than an exception: the study goes on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tuner.driver import drive_sync
from tuner.engines.base import Config, Device, EngineAdapter, LaunchSpec, ModelSpec
from tuner.engines.env import EngineEnv
from tuner.errors import EngineLaunchError
from tuner.failures import classify_serve
from tuner.goodput import goodput, steady_throughput
from tuner.metrics import parse_prometheus, summarize
from tuner.process import ServerProcess, free_port, tail
from tuner.progress import Progress
from tuner.telemetry import MemorySampler
from tuner.workloads.base import Workload

MAX_ERROR_RATE = 0.005
TTFT_AGREEMENT = 0.10  # client and server mean TTFT further apart than this: the trial is flagged


@dataclass(frozen=True)
class TrialContext:
    engines: dict[str, tuple[EngineAdapter, EngineEnv]]
    model: ModelSpec
    device: Device
    workload: Workload
    log_dir: Path
    progress: Progress
    boot_deadline_s: float = 300.0
    slo: dict[str, float] = field(default_factory=dict)


@dataclass
class TrialResult:
    config: Config
    launch: LaunchSpec
    engine_version: str
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    server: dict[str, float | None] = field(default_factory=dict)
    served_by: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    boot_s: float | None = None
    log_path: str = ""
    log_tail: str = ""
    warnings: list[str] = field(default_factory=list)
    ttft_samples_ms: list[float] = field(default_factory=list)  # every successful request's, for CDFs

    @property
    def ttft_p95_ms(self) -> float:
        return self.metrics.get("ttft_p95_ms", math.inf) if self.failure is None else math.inf

    @property
    def output_throughput_tok_s(self) -> float:
        return self.metrics.get("output_throughput_tok_s", 0.0) if self.failure is None else 0.0


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


def run_trial(number: int, config: Config, ctx: TrialContext, repeat: int | None = None) -> TrialResult:
    """Run one config once; ``repeat`` numbers a finalist's fresh-boot repeat (its own log file)."""
    adapter, env = ctx.engines[config.engine]
    spec = adapter.launch(config, ctx.model, ctx.device, free_port(), env.python, env.version)
    suffix = "" if repeat is None else f"-repeat{repeat}"
    log_path = ctx.log_dir / f"trial-{number:04d}-{config.engine}{suffix}.log"
    result = TrialResult(config=config, launch=spec, engine_version=env.version, log_path=str(log_path))
    ctx.progress.phase(number, "boot", _describe(config))
    with ServerProcess(spec, log_path) as server, MemorySampler(ctx.device.kind, server.pid) as memory:
        try:
            result.boot_s = server.wait_ready(ctx.boot_deadline_s)
        except EngineLaunchError as exc:
            result.failure, result.log_tail = exc.failure, exc.log_tail
            ctx.progress.phase(number, "failed", f"{exc.failure} at boot")
        else:
            _serve(number, server, adapter, ctx, result)
            result.log_tail = tail(log_path)
    result.peak_memory_bytes = memory.peak_bytes
    return result


def _serve(number: int, server: ServerProcess, adapter: EngineAdapter, ctx: TrialContext, result: TrialResult) -> None:
    workload, spec = ctx.workload, server.spec
    ready_at = server.log_size()
    with httpx.Client(timeout=10.0) as client:
        result.served_by = identify_server(client, server.base_url)
        ctx.progress.phase(number, "warmup", f"{len(workload.warmup)} requests, boot {result.boot_s:.0f} s")
        drive_sync(None, server.base_url, spec.served_model, workload.warmup, concurrency=workload.concurrency)
        if not _reset_prefix_cache(client, server, adapter):
            result.warnings.append("prefix cache not reset after warmup: the workload may start warm")
        before = scrape_metrics(client, server.base_url)
        ctx.progress.phase(number, "drive", f"{len(workload.requests)} requests at concurrency {workload.concurrency}")
        drove = drive_sync(
            None, server.base_url, spec.served_model, workload.requests, concurrency=workload.concurrency
        )
        after = scrape_metrics(client, server.base_url)
        alive = server.alive() and _healthy(client, server)
    result.metrics = summarize(drove) | goodput(drove, ctx.slo)
    result.metrics["steady_output_throughput_tok_s"] = steady_throughput(drove)
    result.ttft_samples_ms = sorted(
        round((r.first_token_s - r.sent_s) * 1e3, 2) for r in drove.records if r.error is None and r.first_token_s
    )
    result.server = adapter.server_stats(before, after) if after else {}
    result.warnings += _clock_warnings(result)
    since_ready = tail(server.log_path, max_lines=400, start=ready_at)
    result.failure = classify_serve(since_ready, alive, result.metrics["error_rate"], MAX_ERROR_RATE)
    m = result.metrics
    score = f"ttft_p95={m['ttft_p95_ms']:.0f} ms  throughput={m['output_throughput_tok_s']:.1f} tok/s"
    if result.failure is not None:
        score = f"failed: {result.failure}"

    ctx.progress.phase(number, "score", score)


def _reset_prefix_cache(client: httpx.Client, server: ServerProcess, adapter: EngineAdapter) -> bool:
    """Empty the prefix cache the warmup filled, so every trial starts equally cold."""
    if adapter.reset_cache_path is None:
        return False
    try:
        return client.post(server.base_url + adapter.reset_cache_path).status_code == 200
    except httpx.HTTPError:
        return False


def _clock_warnings(result: TrialResult) -> list[str]:
    """Compare the client's mean TTFT with the server's own histogram mean over the same requests."""
    server_ms, client_ms = result.server.get("server_ttft_mean_ms"), result.metrics.get("ttft_mean_ms")
    if server_ms is None or client_ms is None or not math.isfinite(client_ms) or server_ms <= 0:
        return []
    gap = abs(client_ms - server_ms) / server_ms
    result.metrics["ttft_client_vs_server_pct"] = 100.0 * (client_ms - server_ms) / server_ms
    if gap <= TTFT_AGREEMENT:
        return []
    return [f"client mean TTFT {client_ms:.0f} ms differs from the server's {server_ms:.0f} ms by {gap:.0%}"]


def _healthy(client: httpx.Client, server: ServerProcess) -> bool:
    try:
        return client.get(server.base_url + server.spec.health_path).status_code == 200
    except httpx.HTTPError:
        return False


def _describe(config: Config) -> str:
    if config.is_default:
        return f"{config.engine} engine defaults"
    return config.engine + " " + " ".join(f"{k}={v}" for k, v in config.params.items())
