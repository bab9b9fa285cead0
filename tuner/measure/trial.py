"""One trial: boot the engine, warm up, drive the workload, score, stop; and the trial's types.

``TrialContext`` is what a trial runs with, ``TrialResult`` what it gives back. Every path out of
``run_trial`` stops the server's whole process group (``ServerProcess``), and a failure becomes a
``TrialResult`` with a failure class rather than an exception: the study goes on. The serving phases
run on a server that is up: warmup, cache reset, the measured workload, the stress run; and what the
server says about itself (``/metrics``, ``/v1/models``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from tuner.client.driver import DriveResult, RequestRecord, drive_sync
from tuner.engines.base import CacheReset, Config, Device, EngineAdapter, LaunchSpec, ModelSpec
from tuner.engines.env import EngineEnv
from tuner.errors import EngineLaunchError
from tuner.measure.failures import classify_serve
from tuner.measure.goodput import goodput, steady_throughput
from tuner.measure.metrics import MAX_ERROR_RATE, request_log, scrape_metrics, summarize
from tuner.measure.process import ServerProcess, free_port, head, tail
from tuner.measure.rate_steps import CapacityOutcome, CapacityPlan, Measured, measure_step, search_capacity
from tuner.measure.stress import VERSION, peak_concurrency, stress_requests
from tuner.measure.supply import RequestSupply
from tuner.measure.telemetry import MemorySampler
from tuner.progress import Progress
from tuner.workloads.base import Workload

__all__ = ["MAX_ERROR_RATE", "TrialContext", "TrialResult", "run_trial", "score_capacity"]


def run_trial(
    number: int,
    config: Config,
    ctx: TrialContext,
    repeat: int | None = None,
    stress: bool = False,
    watch: WatchFactory | None = None,
    incumbents: Mapping[str, float] | None = None,
    prune: bool = True,
) -> TrialResult:
    """Run one config once; ``repeat`` numbers a finalist's fresh-boot repeat (its own log file);
    ``stress`` adds the stress run (``tuner.measure.stress``) on the same server once the workload served;
    ``watch`` lets a pruner stop the workload early (the result then carries ``pruned``). With a
    capacity plan (``ctx.capacity``) the server's capacity is searched instead of driving the fixed
    workload, starting near ``incumbents`` (the best capacity per tier so far) and, with ``prune``,
    stopping when the config cannot come close to them."""
    adapter, env = ctx.engines[config.engine]
    spec = adapter.launch(config, ctx.model, ctx.device, free_port(), env.python, env.version)
    if ctx.gpus is not None:  # this slot's GPUs only: parallel trials never share one
        spec = replace(spec, trial_env={**spec.trial_env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, ctx.gpus))})
    suffix = "" if repeat is None else f"-repeat{repeat}"
    log_path = ctx.log_dir / f"trial-{number:04d}-{config.engine}{suffix}.log"
    result = TrialResult(config=config, launch=spec, engine_version=env.version, log_path=str(log_path))
    ctx.progress.phase(number, "boot", _describe(config))
    with ServerProcess(spec, log_path) as server, MemorySampler(ctx.device.kind, server.pid, ctx.gpus) as memory:
        try:
            result.boot_s = server.wait_ready(ctx.boot_deadline_s)
        except EngineLaunchError as exc:
            result.failure, result.log_tail = exc.failure, exc.log_tail
            ctx.progress.phase(number, "failed", f"{exc.failure} at boot")
        else:
            result.launch = server.spec  # the launch that booted (a boot retried on a fresh port has another)
            result.phases_s["boot"] = round(result.boot_s, 2)
            if ctx.capacity is not None:
                serve_capacity(number, server, adapter, ctx, result, incumbents, prune)
            else:
                serve_workload(number, server, adapter, ctx, result, watch)
            if stress and result.failure is None and result.pruned is None:
                stress_run(number, server, adapter, ctx, result)
            result.log_tail = tail(log_path)
    result.peak_memory_bytes = memory.peak_bytes
    result.engine_gpu_peak_bytes = memory.engine_peak_bytes
    if log_path.exists():  # what the engine changed of the config it was given, as its boot logged it
        result.engine_overrides = adapter.overrides_in(head(log_path))
    return result


def _describe(config: Config) -> str:
    if config.is_default:
        return f"{config.engine} engine defaults"
    return config.engine + " " + " ".join(f"{k}={v}" for k, v in config.params.items())


# What a trial hands back, and the limits it is judged by.
TTFT_AGREEMENT = 0.10  # client and server mean TTFT further apart than this: the trial is flagged
RESET_PATIENCE_S = 30.0  # how long a busy server's refusal to empty its prefix cache is waited out
RESET_POLL_S = 0.5
RESET_MIN_TIMEOUT_S = 5.0  # a last ask near the deadline still gets this long to answer
# Called with the number of measured requests and the boot time just before they are sent; returns
# the driver's on_record callback, which may raise ``Pruned`` to stop the workload (``tuner.search.pruning``).
WatchFactory = Callable[[int, float], Callable[[RequestRecord], None]]


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
    gpus: tuple[int, ...] | None = None  # this trial's GPUs (CUDA_VISIBLE_DEVICES); None: all, or the CPU
    capacity: CapacityPlan | None = None  # search capacity under SLO tiers instead of driving the workload once


@dataclass
class TrialResult:
    config: Config
    launch: LaunchSpec
    engine_version: str
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    server: dict[str, float | None] = field(default_factory=dict)
    served_by: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: int = 0  # device-wide on a GPU (another tenant's memory too)
    engine_gpu_peak_bytes: int | None = None  # the engine's own processes (GPU; None: unknown)
    boot_s: float | None = None
    log_path: str = ""
    log_tail: str = ""
    warnings: list[str] = field(default_factory=list)
    engine_overrides: list[str] = field(default_factory=list)  # what the engine changed (config_overrides)
    ttft_samples_ms: list[float] = field(default_factory=list)  # every successful request's, for CDFs
    request_log: list[dict[str, Any]] = field(default_factory=list)  # see request_log()
    phases_s: dict[str, float] = field(default_factory=dict)  # wall time of boot, warmup, drive, stress
    stress: dict[str, Any] | None = None  # the stress run's raw outcome (tuner.measure.stress), when asked for
    pruned: dict[str, Any] | None = None  # where the pruner stopped the workload (tuner.search.pruning)
    memory_facts: dict[str, float] = field(default_factory=dict)  # the engine's own memory lines
    memory_estimate: dict[str, Any] | None = None  # what the screen predicted (tuner.search.memory)
    capacity: dict[str, Any] | None = None  # every tier's capacity search and its curve (CapacityOutcome)

    @property
    def ttft_p95_ms(self) -> float:
        return self.metrics.get("ttft_p95_ms", math.inf) if self.failure is None else math.inf

    @property
    def output_throughput_tok_s(self) -> float:
        return self.metrics.get("output_throughput_tok_s", 0.0) if self.failure is None else 0.0


class Pruned(Exception):
    """Raised from the driver's ``on_record`` to stop the workload; carries what was seen."""

    def __init__(self, at_requests: int, of: int, values: dict[str, float], saved_s: float, beaten_by: int) -> None:
        super().__init__(f"pruned after {at_requests}/{of} requests: trial {beaten_by} was better")
        self.info = {"at_requests": at_requests, "of": of, "values": values, "saved_s": saved_s, "beaten_by": beaten_by}


# The live server: what really serves, and emptying its prefix cache.
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


def warm_up(number: int, server: ServerProcess, client: httpx.Client, ctx: TrialContext, result: TrialResult) -> None:
    """Ask the server what it serves, then send the workload's warmup requests, whose timings are discarded."""
    result.served_by = identify_server(client, server.base_url)
    workload = ctx.workload
    ctx.progress.phase(number, "warmup", f"{len(workload.warmup)} requests, boot {result.boot_s:.0f} s")
    started = time.monotonic()
    drive_sync(None, server.base_url, server.spec.served_model, workload.warmup, concurrency=workload.concurrency)
    result.phases_s["warmup"] = round(time.monotonic() - started, 2)


def serve_capacity(
    number: int, server: ServerProcess, adapter: EngineAdapter, ctx: TrialContext, result: TrialResult,
    incumbents: Mapping[str, float] | None, prune: bool,
) -> None:  # fmt: skip
    """Warm up, then search each scored tier's capacity (``tuner.measure.rate_steps``)."""
    plan, workload, spec = ctx.capacity, ctx.workload, server.spec
    assert plan is not None
    ready_at = server.log_size()
    with httpx.Client(timeout=10.0) as client:
        warm_up(number, server, client, ctx, result)
        cache_reset = [reset_prefix_cache(client, server.base_url, adapter)]
        supply = RequestSupply.of(workload)

        def measure(rate: float, hold: bool = False) -> Measured:
            cache_reset.append(reset_prefix_cache(client, server.base_url, adapter))
            return measure_step(server.base_url, spec.served_model, supply, rate, plan, adapter, hold)

        def said(tier: str, step: Measured, verdict: str) -> None:
            what = f"{tier}: {step.rate_req_s:.3g} req/s, {len(step.rows)} requests in {step.duration_s:.0f} s"
            ctx.progress.phase(number, "step", f"{what}: attainment {verdict}")

        outcome = search_capacity(measure, plan, incumbents, prune, said)
        alive = server.alive() and healthy(client, server)
    if not all(cache_reset):
        result.warnings.append("prefix cache not reset between steps: later steps may have started warm")
    since_ready = tail(server.log_path, max_lines=400, start=ready_at)
    score_capacity(result, outcome, plan, prune, since_ready, alive, adapter)
    scored = {tier: outcome.results[tier] for tier in plan.scored}
    text = ", ".join(f"{tier} {r.capacity_req_s:.3g} req/s ({r.stop_reason})" for tier, r in scored.items())
    ctx.progress.phase(number, "score", f"failed: {result.failure}" if result.failure else f"capacity: {text}")


def score_capacity(
    result: TrialResult, outcome: CapacityOutcome, plan: CapacityPlan, prune: bool, since_ready: str, alive: bool,
    adapter: EngineAdapter | None,
) -> None:  # fmt: skip
    """A finished capacity search as the trial's result: its figures, its failure class from the log
    since the server was ready, and the pruned mark when every scored tier was pruned. Shared with the
    tabular benchmark, which replays searches over recorded steps."""
    result.phases_s["capacity"] = round(outcome.search_s, 2)
    _score_capacity(result, outcome, plan)
    result.failure = classify_serve(since_ready, alive, result.metrics["error_rate"], MAX_ERROR_RATE, adapter)
    scored = {tier: outcome.results[tier] for tier in plan.scored}
    if prune and all(r.pruned for r in scored.values()):
        sent = sum(len(m.rows) for m in outcome.measured)
        result.pruned = {"at_requests": sent, "steps": len(outcome.measured), "values": {}, "saved_s": None,
                         "capacity": {tier: r.capacity_req_s for tier, r in scored.items()}}  # fmt: skip


def _score_capacity(result: TrialResult, outcome: CapacityOutcome, plan: CapacityPlan) -> None:
    """The trial's figures: each scored tier's capacity, and the latencies at the first tier's capacity.

    The error rate counts the steps at or below that capacity (the lowest step when none passed):
    above it, timeouts are the overload the search looks for, not a broken config.
    """
    first = outcome.results[plan.scored[0]]
    by_rate = {m.rate_req_s: m for m in outcome.measured}
    lowest = min(by_rate)
    # the step the capacity stands on (the one served whole where a look passed the rate early first)
    step = first.at_capacity() or next(step for step in first.steps if step.rate_req_s == lowest)
    within = [m for rate, m in by_rate.items() if rate <= max(first.capacity_req_s, lowest)]
    sent = sum(len(m.rows) for m in within)
    errors = sum(1 for m in within for row in m.rows if row["error"] is not None)  # unfinished: a miss, not an error
    figures = {k: v for k, v in step.as_dict().items() if k.endswith("_ms") or k.endswith("_s")}
    result.metrics = {k: float(v) for k, v in figures.items() if isinstance(v, int | float)}
    result.metrics.update({
        "capacity_req_s": first.capacity_req_s,
        "attainment_at_capacity": step.attainment,
        "error_rate": errors / sent if sent else 1.0,
        "n_errors": float(errors),
        "n_requests": float(sent),
    })  # fmt: skip
    for tier, r in outcome.results.items():
        result.metrics[f"capacity_{tier}_req_s"] = r.capacity_req_s
    rows = by_rate[step.rate_req_s].rows
    result.request_log = rows
    result.ttft_samples_ms = sorted(
        round((r["first_s"] - r["sent_s"]) * 1e3, 2) for r in rows if r["error"] is None and r["first_s"] is not None
    )
    result.server = dict(step.server)
    result.capacity = outcome.as_dict(plan)


def serve_workload(
    number: int, server: ServerProcess, adapter: EngineAdapter, ctx: TrialContext, result: TrialResult,
    watch: WatchFactory | None,
) -> None:  # fmt: skip
    workload, spec = ctx.workload, server.spec
    ready_at = server.log_size()
    with httpx.Client(timeout=10.0) as client:
        warm_up(number, server, client, ctx, result)
        if not reset_prefix_cache(client, server.base_url, adapter):
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
    result.failure = classify_serve(since_ready, alive, result.metrics["error_rate"], MAX_ERROR_RATE, adapter)
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
    """The workload's longest request at its peak concurrency, cold cache (``tuner.measure.stress``); the
    raw outcome goes to ``result.stress`` and is judged by the caller, who knows the default's."""
    requests, peak = stress_requests(ctx.workload), peak_concurrency(ctx.workload)
    mark = server.log_size()
    with httpx.Client(timeout=10.0) as client:
        reset = reset_prefix_cache(client, server.base_url, adapter)
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


def reset_prefix_cache(
    client: httpx.Client, base_url: str, adapter: EngineAdapter, patience_s: float = RESET_PATIENCE_S
) -> bool:
    """Empty the prefix cache the warmup (or the last step) filled, so each start is equally cold;
    True once the server did. One that says it is busy while requests still run (the adapter's
    ``cache_reset``: after a step cut short it is still ending the cancelled ones) is asked again,
    and a slow answer waited for, up to ``patience_s`` in all, whatever the client's own timeout:
    an engine still ending a cut step's requests on loaded cores may answer later than its callers'
    clients allow any other request (CHANGELOG, "a slow prefix-cache reset")."""
    if adapter.reset_cache_path is None:
        return False
    deadline = time.monotonic() + patience_s
    while True:
        try:
            answer = client.post(base_url + adapter.reset_cache_path,
                                 timeout=max(deadline - time.monotonic(), RESET_MIN_TIMEOUT_S))  # fmt: skip
        except httpx.HTTPError:
            return False
        said = adapter.cache_reset(answer.status_code, answer.content)
        if said is CacheReset.DONE:
            return True
        if said is CacheReset.REFUSED or time.monotonic() >= deadline:
            return False
        time.sleep(RESET_POLL_S)


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
