"""Capacity on a running server: serve steps of open-loop load and search each SLO tier over them.

A step sends the workload's requests at one rate, released as seeded Poisson arrivals (or gamma
gaps of the preset's burstiness), for at least ``min_step_s`` and ``min_requests``; the pool is
cycled, each pass with fresh request and session ids. Before every step the prefix cache is reset,
so each rate starts equally cold and a later step never rides on an earlier one's cache. A monitor
stops a step as soon as the server is saturated or attainment has collapsed under every tier, and
a step's drain is bounded: requests still running then are misses. Steps are measured once per
rate and judged under every tier's SLO (``tuner.measure.capacity``), so the tiers share them.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from tuner.client.driver import drive
from tuner.client.sse import RequestRecord
from tuner.client.transport import StreamTransport
from tuner.engines.base import EngineAdapter
from tuner.measure.capacity import SATURATED, CapacityResult, CapacitySearch, Row, cut_reason, summarize_step
from tuner.measure.metrics import itl_ms, request_row, scrape_metrics
from tuner.workloads.arrivals import Arrival, release_times
from tuner.workloads.base import Request

MONITOR_EVERY_S = 0.25
DRAIN_SHARE = 0.5  # a step may run this share of its schedule past the last release, then leftovers are misses
MIN_DRAIN_S = 5.0
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CapacityPlan:
    """What every trial's capacity search runs with, resolved once from the options."""

    tiers: Mapping[str, Mapping[str, float]]  # tier name -> SLO bounds in ms
    scored: tuple[str, ...]  # the tiers whose capacity is an objective value, in order
    target: float = 0.9
    resolution: float = 0.10
    start_rate: float = 1.0
    growth: float = 2.0
    max_steps: int = 10
    max_rate: float | None = None
    min_step_s: float = 12.0
    min_requests: int = 40
    burstiness: float = 1.0
    seed: int = 0

    def search(self, incumbent: float | None, prune: bool) -> CapacitySearch:
        return CapacitySearch(
            target=self.target, resolution=self.resolution, start_rate=self.start_rate, growth=self.growth,
            incumbent=incumbent, max_steps=self.max_steps, max_rate=self.max_rate, prune=prune,
        )  # fmt: skip


@dataclass
class Measured:
    """One rate's raw step: request rows (seconds after its start), ITL gaps, server deltas."""

    rate_req_s: float
    rows: list[dict[str, Any]]
    itl_ms: list[float]
    duration_s: float
    server: dict[str, float | None] = field(default_factory=dict)
    aborted: bool = False
    cut_reason: str | None = None  # why the monitor cut it (tuner.measure.capacity.cut_reason)


@dataclass
class CapacityOutcome:
    """Every tier's search over the shared steps."""

    results: dict[str, CapacityResult]
    measured: list[Measured]
    search_s: float

    def as_dict(self, plan: CapacityPlan) -> dict[str, Any]:
        return {
            "objective_tier": plan.scored[0],
            "tiers": {name: {"slo": dict(plan.tiers[name]), **r.as_dict()} for name, r in self.results.items()},
            "search_s": round(self.search_s, 2),
            "steps_measured": len(self.measured),
        }


def step_requests(pool: Sequence[Request], rate: float, plan: CapacityPlan) -> list[Request]:
    """The step's requests: the pool cycled to its length, units released at ``rate``."""
    n = max(plan.min_requests, math.ceil(rate * plan.min_step_s))
    units: list[list[Request]] = []
    for request in pool:
        if units and request.session_id is not None and units[-1][0].session_id == request.session_id:
            units[-1].append(request)
        else:
            units.append([request])
    chosen: list[list[Request]] = []
    for cycle, unit in zip(itertools.count(), itertools.cycle(units)):
        if sum(len(u) for u in chosen) >= n:
            break
        lap = cycle // len(units)
        chosen.append([_renamed(r, lap) for r in unit])
    times = release_times(len(chosen), Arrival(rate=rate, burstiness=plan.burstiness), plan.seed)
    out: list[Request] = []
    for unit, at in zip(chosen, times, strict=True):
        out += [replace(r, arrival_s=at if i == 0 else None) for i, r in enumerate(unit)]
    return out


def _renamed(request: Request, lap: int) -> Request:
    if lap == 0:
        return request
    session = None if request.session_id is None else f"{request.session_id}~{lap}"
    return replace(request, request_id=f"{request.request_id}~{lap}", session_id=session)


def _rows(records: Sequence[RequestRecord], requests: Sequence[Request], started_s: float, now_s: float) -> list[Row]:
    """Rows of the requests ended so far, plus those released and still running (no end yet)."""
    ended = {r.request_id for r in records}
    rows: list[Row] = [request_row(r, started_s) for r in records]
    for request in requests:
        if request.request_id not in ended and request.arrival_s is not None and request.arrival_s <= now_s:
            rows.append({"sent_s": request.arrival_s, "first_s": None, "done_s": None, "output_tokens": 0,
                         "prompt_tokens": request.prompt_tokens, "error": None})  # fmt: skip
    return rows


async def _serve_step(
    base_url: str,
    model: str,
    requests: Sequence[Request],
    deadline_s: float,
    stop: Callable[[list[Row], float], str | None],
) -> tuple[list[RequestRecord], float, float, str | None]:
    """Drive ``requests`` open loop; cancel at ``deadline_s``, or when ``stop`` gives a reason (returned)."""
    records: list[RequestRecord] = []
    transport = StreamTransport(max_connections=len(requests))
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(REQUEST_TIMEOUT_S)) as client:
        started = time.perf_counter()
        task = asyncio.create_task(
            drive(client, base_url, model, requests, concurrency=len(requests), on_record=records.append)
        )
        reason: str | None = None
        cut = False
        while not task.done():
            await asyncio.sleep(MONITOR_EVERY_S)
            now = time.perf_counter() - started
            reason = None if now > deadline_s else stop(_rows(records, requests, started, now), now)
            if now > deadline_s or reason is not None:
                cut = True
                task.cancel()
                break
        try:
            await task
        except asyncio.CancelledError:
            # Only the cut this monitor made is swallowed: a cancel of this step itself (Ctrl-C,
            # which asyncio turns into a cancel of the main task) must reach the caller as one.
            current = asyncio.current_task()
            if not cut or (current is not None and current.cancelling()):
                raise
    return records, started, time.perf_counter(), reason


def measure_step(
    base_url: str, model: str, pool: Sequence[Request], rate: float, plan: CapacityPlan,
    adapter: EngineAdapter | None,
) -> Measured:  # fmt: skip
    """One step at ``rate`` on a server that is up, its prefix cache reset by the caller."""
    requests = step_requests(pool, rate, plan)
    schedule_s = max((r.arrival_s or 0.0) for r in requests)
    warmup_s = schedule_s * 0.1

    def stop(rows: list[Row], now: float) -> str | None:
        reasons = [cut_reason(rows, slo, plan.target, now, warmup_s) for slo in plan.tiers.values()]
        if None in reasons:
            return None  # some tier could still pass this step
        return SATURATED if SATURATED in reasons else reasons[0]

    with httpx.Client(timeout=10.0) as client:
        before = scrape_metrics(client, base_url)
        deadline = schedule_s + max(MIN_DRAIN_S, DRAIN_SHARE * schedule_s)
        records, started, ended, reason = asyncio.run(_serve_step(base_url, model, requests, deadline, stop))
        after = scrape_metrics(client, base_url)
    duration = ended - started
    rows = [dict(r) for r in _rows(records, requests, started, duration)]
    gaps = [gap for r in records if r.error is None for gap in itl_ms(r)]
    server = adapter.server_stats(before, after) if adapter is not None and before and after else {}
    return Measured(rate, rows, gaps, duration, server, reason is not None, reason)


def search_capacity(
    measure: Callable[[float], Measured],
    plan: CapacityPlan,
    incumbents: Mapping[str, float] | None = None,
    prune: bool = True,
    said: Callable[[str, Measured, str], None] | None = None,
) -> CapacityOutcome:
    """Every tier's search (the scored tiers first), measuring each rate once across tiers."""
    started = time.monotonic()
    by_rate: dict[float, Measured] = {}
    order = list(plan.scored) + [t for t in plan.tiers if t not in plan.scored]
    results: dict[str, CapacityResult] = {}
    for tier in order:
        if tier not in plan.scored:
            continue  # only the scored tiers are searched: an unscored tier's steps would cost boots' time
        slo = plan.tiers[tier]
        search = plan.search((incumbents or {}).get(tier), prune)
        while (rate := search.next_rate()) is not None:
            key = round(rate, 6)
            fresh = key not in by_rate
            if fresh:
                by_rate[key] = measure(rate)
            m = by_rate[key]
            step = summarize_step(rate, m.rows, slo, plan.target, m.duration_s, itl_ms=m.itl_ms, server=m.server)
            if m.aborted:
                # The monitor cut it: saturated (requests in flight kept growing, so no SLO holds
                # for long at this rate), or collapsed under every tier. Never a pass, and the
                # step says so, since the end-of-step figures alone may look like one.
                step = replace(step, passed=False, cut_s=round(m.duration_s, 2), cut_reason=m.cut_reason)
            search.record(step, measured=fresh)
            if said is not None:
                why = f": {step.cut_reason}" if step.cut_reason else ""
                cut = f" (cut at {step.cut_s:.0f} s{why})" if step.cut_s is not None else ""
                said(tier, m, f"{step.attainment:.0%} {'pass' if step.passed else 'fail'}{cut}")
        results[tier] = search.result()
    return CapacityOutcome(results, list(by_rate.values()), time.monotonic() - started)
