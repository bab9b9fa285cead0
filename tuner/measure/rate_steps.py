"""Capacity on a running server: serve steps of open-loop load and search each SLO tier over them.

A step sends requests at one rate, released as seeded Poisson arrivals (or gamma gaps of the
preset's burstiness). Every request of a search is distinct: a step takes its requests from the
search's ``RequestSupply`` (``tuner.measure.supply``), which never hands one out twice. Before every
step the prefix cache is reset, so each rate starts equally cold.

A step serves at least ``min_step_s`` and ``min_requests``; then it *looks* (``step_limit`` looks,
one per minimum's length): it stops as soon as every scored tier's attainment interval lies on one
side of the target, and otherwise goes on, up to ``step_limit`` times its minimum, after which an
undecided tier stays undecided (not a pass). A look counts only requests sent since the ramp-up
whose outcome is known by then, in send order, so the slow requests still running cannot be left
out, and it waits until ``min_requests`` of those are known. A monitor also stops a step once
attainment has collapsed under every tier, or the server is saturated (judged every
``SATURATION_EVERY_S``), and a step's drain is bounded: requests still running then are misses.
A step the monitor stopped counts only the requests whose outcome was known when it stopped: the
ones still running were cut, not missed. The server's waiting queue is sampled through the
step, and a queue that keeps growing is no pass.
Steps are measured once per rate and judged under every tier's SLO (``tuner.measure.capacity``),
so the tiers share them.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import httpx

from tuner.client.driver import drive
from tuner.client.sse import RequestRecord
from tuner.client.transport import StreamTransport
from tuner.engines.base import EngineAdapter
from tuner.engines.prometheus import has_metric, metric_total
from tuner.measure.capacity import (
    ATTAINMENT_TARGET,
    CONFIDENCE,
    PASS,
    RESOLUTION,
    SATURATED,
    SATURATION_EVERY_S,
    STEADY_TRIM,
    UNDECIDED,
    CapacityResult,
    CapacitySearch,
    Row,
    Step,
    attainment_interval,
    cut_reason,
    decide,
    growing,
    look_z,
    outcomes_in,
    resolved_until,
    saturation_due,
    summarize_step,
)
from tuner.measure.metrics import itl_ms, request_row, scrape_metrics
from tuner.measure.supply import RequestSupply
from tuner.workloads.arrivals import Arrival, release_times
from tuner.workloads.base import Request

MONITOR_EVERY_S = 0.25
DRAIN_SHARE = 0.5  # a step may run this share of its schedule past the last release, then leftovers are misses
MIN_DRAIN_S = 5.0
REQUEST_TIMEOUT_S = 120.0
QUEUE_EVERY_S = 1.0  # how often the server's waiting queue is sampled through a step
DECIDED = "decided"  # a look decided every scored tier: the step ends there


@dataclass(frozen=True)
class CapacityPlan:
    """What every trial's capacity search runs with, resolved once from the options."""

    tiers: Mapping[str, Mapping[str, float]]  # tier name -> SLO bounds in ms
    scored: tuple[str, ...]  # the tiers whose capacity is an objective value, in order
    target: float = ATTAINMENT_TARGET
    resolution: float = RESOLUTION
    start_rate: float = 1.0
    growth: float = 2.0
    max_steps: int = 10
    max_rate: float | None = None
    min_step_s: float = 12.0
    min_requests: int = 40
    burstiness: float = 1.0
    seed: int = 0
    step_limit: int = 3  # an undecided step goes on up to this many times its minimum, looking once per minimum
    confidence: float = CONFIDENCE  # the chance a decided step is decided right, over all its looks
    # the search each tier runs (tests/benchmarks/_previous_rules.py puts earlier rules here)
    search_rule: ClassVar[type[CapacitySearch]] = CapacitySearch

    @property
    def z(self) -> float:
        """The one-sided quantile each look's interval uses (``tuner.measure.capacity.look_z``)."""
        return look_z(self.step_limit, self.confidence)

    def look_s(self, rate: float) -> float:
        """How long a step at ``rate`` serves before its first look, and between looks."""
        return max(self.min_step_s, self.min_requests / rate)

    @property
    def look_sample(self) -> int:
        """The fewest requests with a known outcome, under each scored tier, that a look decides on."""
        return self.min_requests

    @property
    def scored_slos(self) -> list[Mapping[str, float]]:
        """The SLO bounds of each scored tier, in ``scored``'s order."""
        return [self.tiers[tier] for tier in self.scored]

    @property
    def saturation_every_s(self) -> float:
        """How often, in step time, the monitor judges the saturation test (``saturation_due``)."""
        return SATURATION_EVERY_S

    def search(self, incumbent: float | None, prune: bool) -> CapacitySearch:
        return self.search_rule(
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
    window_s: tuple[float, float] | None = None  # the send times attainment counts (None: the steady window)
    looks: int = 0  # looks taken; fewer than the plan's limit when a look decided every scored tier
    queue_growing: bool = False  # the server's waiting queue kept growing over the window
    replayed: int = 0  # requests of a finite trace sent again (its order kept)
    held: bool = True  # served to its end; False when a look passed a tier early (CapacitySearch confirms it)

    def compact(self) -> dict[str, Any]:
        """The step as a trial stores it: its rate, duration, server counters and every request as
        ``ROW_FIELDS`` (what the performance model, ``tuner.search.model``, fits from)."""
        return {
            "rate_req_s": self.rate_req_s, "duration_s": round(self.duration_s, 3), "aborted": self.aborted,
            "server": {k: _rounded(v) for k, v in self.server.items()},
            "rows": [[_rounded(r.get(k)) for k in ROW_FIELDS] for r in self.rows],
        }  # fmt: skip


ROW_FIELDS = ("sent_s", "first_s", "done_s", "prompt_tokens", "output_tokens", "error", "request_id")


def _rounded(value: Any) -> Any:
    """Times to 0.1 ms; a non-finite figure (a counter that did not move) as None, as JSON needs."""
    if isinstance(value, float):
        return round(value, 4) if math.isfinite(value) else None
    return value


@dataclass
class CapacityOutcome:
    """Every tier's search over the shared steps."""

    results: dict[str, CapacityResult]
    measured: list[Measured]
    search_s: float
    interrupted: bool = False  # Ctrl-C or SIGTERM stopped it: the tiers and steps judged until then

    def as_dict(self, plan: CapacityPlan) -> dict[str, Any]:
        return {
            "objective_tier": plan.scored[0],
            "tiers": {name: {"slo": dict(plan.tiers[name]), **r.as_dict()} for name, r in self.results.items()},
            "interrupted": self.interrupted,
            "search_s": round(self.search_s, 2),
            "steps_measured": len(self.measured),
            "measured": [m.compact() for m in self.measured],
        }


def step_requests(supply: RequestSupply, rate: float, plan: CapacityPlan) -> tuple[list[Request], int]:
    """The step's requests, enough for ``step_limit`` looks at ``rate``: distinct units from the
    supply, released at ``rate``; and how many are replays of a finite pool."""
    n = math.ceil(rate * plan.look_s(rate) * plan.step_limit)
    units, replayed = supply.take(n)
    times = release_times(len(units), Arrival(rate=rate, burstiness=plan.burstiness), plan.seed)
    out: list[Request] = []
    for unit, at in zip(units, times, strict=True):
        out += [replace(r, arrival_s=at if i == 0 else None) for i, r in enumerate(unit)]
    return out, replayed


def slowest_passing_s(plan: CapacityPlan, longest: int) -> float:
    """The longest a request of ``longest`` output tokens may take and still meet a scored tier's SLO:
    the drain a step waits past its last release, so a long answer that is on time is never cut and
    counted a miss (capped at the request timeout; a step whose requests all end sooner ends sooner)."""
    allowed = []
    for tier in plan.scored:
        slo = plan.tiers[tier]
        by_parts = (slo.get("ttft_p95_ms", math.inf) + slo.get("tpot_p95_ms", math.inf) * max(longest - 1, 0)) / 1e3
        allowed.append(min(by_parts, slo.get("e2e_p95_ms", math.inf) / 1e3))
    return min(max(allowed, default=0.0), REQUEST_TIMEOUT_S)


def _rows(
    records: Sequence[RequestRecord], requests: Sequence[Request], started_s: float, now_s: float,
    firsts: Mapping[str, float] | None = None,
) -> list[Row]:  # fmt: skip
    """Rows of the requests ended so far, plus those released and still running (no end yet; their
    first token where ``firsts``, the perf-counter times the driver heard of, has it)."""
    ended = {r.request_id for r in records}
    # the request's id too: what the performance model looks its prompt up by (tuner.search.model)
    rows: list[Row] = [{**request_row(r, started_s), "request_id": r.request_id} for r in records]
    for request in requests:
        if request.request_id not in ended and request.arrival_s is not None and request.arrival_s <= now_s:
            first = (firsts or {}).get(request.request_id)
            rows.append({"sent_s": request.arrival_s, "first_s": None if first is None else first - started_s,
                         "done_s": None, "output_tokens": 0, "prompt_tokens": request.prompt_tokens,
                         "error": None, "request_id": request.request_id})  # fmt: skip
    return rows


async def _serve_step(
    base_url: str,
    model: str,
    requests: Sequence[Request],
    deadline_s: float,
    stop: Callable[[list[Row], float], str | None],
    queue: Callable[[float], None] | None = None,
) -> tuple[list[RequestRecord], float, float, str | None, dict[str, float]]:
    """Drive ``requests`` open loop; cancel at ``deadline_s``, or when ``stop`` gives a reason (returned).
    ``queue(now)`` is called about every ``QUEUE_EVERY_S`` to sample the server's waiting queue. Also
    returns the first-token times heard (perf counter), by request id."""
    records: list[RequestRecord] = []
    # the first tokens of requests still running: a request seconds into a long answer has had its
    # first token long ago, and the monitor must not read it as one still waiting past the TTFT bound
    firsts: dict[str, float] = {}
    transport = StreamTransport(max_connections=len(requests))
    async with httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(REQUEST_TIMEOUT_S)) as client:
        started = time.perf_counter()
        task = asyncio.create_task(
            drive(
                client,
                base_url,
                model,
                requests,
                concurrency=len(requests),
                on_record=records.append,
                on_first_token=firsts.__setitem__,
            )  # fmt: skip
        )
        reason: str | None = None
        cut = False
        sampled = -math.inf
        while not task.done():
            await asyncio.sleep(MONITOR_EVERY_S)
            now = time.perf_counter() - started
            if queue is not None and now - sampled >= QUEUE_EVERY_S:
                sampled = now
                await asyncio.to_thread(queue, now)
            reason = None if now > deadline_s else stop(_rows(records, requests, started, now, firsts), now)
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
    return records, started, time.perf_counter(), reason, firsts


class Looks:
    """A step's looks: at each multiple of the plan's look time, whether every scored tier is decided
    over the requests whose outcome is known by then (``tuner.measure.capacity.resolved_until``)."""

    def __init__(self, plan: CapacityPlan, rate: float, queue: list[tuple[float, float]], hold: bool = False) -> None:
        """``hold``: serve the step whole unless a look fails every scored tier (a claim's confirmation)."""
        self.plan, self.rate, self.queue, self.hold = plan, rate, queue, hold
        self.look_s = plan.look_s(rate)
        self.warmup_s = STEADY_TRIM * self.look_s
        self.taken = 0
        self.window_s: tuple[float, float] | None = None
        self.decided_s: float | None = None  # when a look decided the step

    def __call__(self, rows: Sequence[Row], now: float) -> str | None:
        # the last look is the step's end, after its drain: one fewer is taken while it serves
        if self.taken + 1 >= self.plan.step_limit or now < (self.taken + 1) * self.look_s:
            return None
        scored = self.plan.scored_slos
        end = min(resolved_until(rows, slo, self.warmup_s, now) for slo in scored)
        outcomes = [outcomes_in(rows, slo, self.warmup_s, end) for slo in scored]
        # A look decides on the plan's minimum sample of known outcomes, never fewer. With long answers
        # the outcomes known by a look lag the requests sent by far: an H200 step was failed on a
        # handful of requests from one burst just after the warm-up, and the same rate passed over its
        # whole length in the next drive (reports/gpu-h200/capacity-check-7/NOTES.md). Until the sample
        # is there no look is spent, so the step keeps every look's share of the confidence.
        if min(len(o) for o in outcomes) < self.plan.look_sample:
            return None
        self.taken += 1
        decisions = [decide(*attainment_interval(o, self.plan.z), self.plan.target) for o in outcomes]
        # The queue is judged up to now, not up to the last send counted: at a rate the server cannot
        # carry, the early requests end on time while the queue builds behind them, and the counted
        # window can be too short to show it (a CPU step passed that way at a rate where the engine's
        # own client failed a lower one: reports/capacity.md, "Capacity you can trust").
        if UNDECIDED in decisions or (PASS in decisions and (self.hold or self.queue_growing(now))):
            return None
        self.window_s, self.decided_s = (self.warmup_s, end), now
        return DECIDED

    def queue_growing(self, end: float) -> bool:
        """Whether the server's waiting queue kept growing over [warm-up, ``end``] (step time)."""
        kept = [(t, n) for t, n in self.queue if self.warmup_s <= t <= end]
        return growing([t for t, _ in kept], [n for _, n in kept], self.rate)


class StepWatch:
    """One step watched as it is served, from the requests seen so far, and ended.

    Calling it with the rows seen at ``now`` gives why the step stops there, or None: the monitor's
    cut (``tuner.measure.capacity.cut_reason``, when every tier gives one), else a look that decided
    it (``DECIDED``). ``ended`` turns what was served into the step's ``Measured``. It reads nothing
    but what it is given, so a simulated server is watched by the same rules as a real one
    (tests/benchmarks/bench_known_search.py)."""

    def __init__(self, plan: CapacityPlan, rate: float, schedule_s: float, longest: int, hold: bool = False) -> None:
        """``schedule_s``: the last release; ``longest``: the longest answer, in output tokens; ``hold``:
        no look passes it early (``Looks``)."""
        self.plan, self.rate, self.schedule_s = plan, rate, schedule_s
        self.queue: list[tuple[float, float]] = []  # (time, waiting) samples, appended while the step runs
        self.looks = Looks(plan, rate, self.queue, hold)
        drain = max(MIN_DRAIN_S, DRAIN_SHARE * self.looks.look_s, slowest_passing_s(plan, longest))
        self.deadline_s = schedule_s + drain  # the step is cut here: requests still running are misses
        self.judged_s = 0.0  # the monitor's last tick (step time)

    def __call__(self, rows: Sequence[Row], now: float) -> str | None:
        warmup = self.looks.warmup_s
        due, self.judged_s = saturation_due(self.judged_s, now, self.plan.saturation_every_s), now
        reasons = [
            cut_reason(rows, slo, self.plan.target, now, warmup, judge_saturation=due)
            for slo in self.plan.tiers.values()
        ]  # fmt: skip
        if None not in reasons:
            return SATURATED if SATURATED in reasons else reasons[0]
        return self.looks(rows, now)  # some tier could still pass this step

    def ended(
        self, rows: list[dict[str, Any]], itl: list[float], duration_s: float, reason: str | None,
        server: dict[str, float | None] | None = None, replayed: int = 0,
    ) -> Measured:  # fmt: skip
        """The step as measured, served for ``duration_s`` and stopped for ``reason`` (None: to its end)."""
        decided = reason == DECIDED
        # served to its end: the requests released in its last ramp-up's length see the load thin out
        end = min(self.schedule_s - self.looks.warmup_s, duration_s)  # a step the monitor cut counts up to the cut
        if reason is not None and not decided:
            # and only the requests whose outcome was known then: those still running were cut, not
            # missed, and counted as misses they made a step cut with nearly every known request on
            # time read as far under the target (reports/gpu-h200/capacity-check-8/NOTES.md)
            known = (resolved_until(rows, slo, self.looks.warmup_s, duration_s) for slo in self.plan.scored_slos)
            end = min([end, *known])
        full = (self.looks.warmup_s, max(end, self.looks.warmup_s))
        window = self.looks.window_s if decided and self.looks.window_s is not None else full
        judged_until = self.looks.decided_s if decided and self.looks.decided_s is not None else window[1]
        return Measured(
            self.rate, rows, itl, duration_s, server or {}, aborted=reason is not None and not decided,
            cut_reason=None if decided else reason, window_s=window, looks=self.looks.taken + (not decided),
            queue_growing=self.looks.queue_growing(judged_until), replayed=replayed, held=not decided,
        )  # fmt: skip


def seen_at(rows: Sequence[dict[str, Any]], now_s: float) -> list[dict[str, Any]]:
    """What a step's monitor knows at ``now_s`` of rows whose times are all known (a simulated step):
    the requests sent by then, those not ended without their end (and without their first token if it
    had not come). A row may be one still running when its step ended (no ``done_s``, maybe no
    ``first_s``), as a drive records it."""
    seen = []
    for r in rows:
        if float(r["sent_s"]) > now_s:
            continue
        if r.get("done_s") is not None and float(r["done_s"]) <= now_s:
            seen.append(r)
        else:
            first = r.get("first_s")
            heard = first is not None and float(first) <= now_s
            seen.append({**r, "done_s": None, "first_s": first if heard else None})
    return seen


def watch_offline(
    plan: CapacityPlan, rate: float, rows: Sequence[dict[str, Any]], waiting: Sequence[tuple[float, float]] = (),
    hold: bool = False, tick_s: float = MONITOR_EVERY_S, longest: int | None = None,
) -> Measured:  # fmt: skip
    """A step whose requests' times are all known already (served by a simulator), watched and ended
    as ``measure_step`` watches a served one: the monitor's cuts and the looks every ``tick_s``, the
    waiting queue (``waiting``: (time, count) at each change) sampled every ``QUEUE_EVERY_S``, and
    requests still running at the drain's deadline left as misses. So a simulated step is judged by
    the very rules of a real one (``judge_served``). ``longest``: the longest answer the step could
    ask for (default: the longest of ``rows``), which bounds its drain."""
    schedule_s = max((float(r["sent_s"]) for r in rows), default=0.0)
    if longest is None:
        longest = max((int(r.get("output_tokens") or 1) for r in rows), default=1)
    watch = StepWatch(plan, rate, schedule_s, longest, hold)
    changes = [t for t, _ in waiting]
    last_end = max([float(r["done_s"]) for r in rows if r.get("done_s") is not None] + [schedule_s])
    reason, now, sampled = None, tick_s, -math.inf
    while now <= min(watch.deadline_s, last_end):
        if changes and now - sampled >= QUEUE_EVERY_S:
            sampled = now
            at = bisect.bisect_right(changes, now) - 1
            watch.queue.append((now, float(waiting[at][1]) if at >= 0 else 0.0))
        reason = watch(seen_at(rows, now), now)
        if reason is not None:
            break
        now += tick_s
    duration = now if reason is not None else min(watch.deadline_s, last_end)
    return watch.ended(seen_at(rows, duration), [], duration, reason)


def measure_step(
    base_url: str, model: str, supply: RequestSupply, rate: float, plan: CapacityPlan,
    adapter: EngineAdapter | None, hold: bool = False,
) -> Measured:  # fmt: skip
    """One step at ``rate`` on a server that is up, its prefix cache reset by the caller: it serves
    until a look decides it, or up to its limit (see the module docstring). With ``hold`` (a claim's
    confirmation) no look passes it: it serves to its end unless a look fails every scored tier."""
    requests, replayed = step_requests(supply, rate, plan)
    schedule_s = max((r.arrival_s or 0.0) for r in requests)
    watch = StepWatch(plan, rate, schedule_s, max((r.max_tokens for r in requests), default=1), hold)
    gauge = adapter.waiting_gauge if adapter is not None else None

    with httpx.Client(timeout=10.0) as client:

        def sample(now: float) -> None:
            samples = scrape_metrics(client, base_url)
            if gauge is not None and has_metric(samples, gauge):
                watch.queue.append((now, metric_total(samples, gauge)))

        before = scrape_metrics(client, base_url)
        records, started, ended, reason, firsts = asyncio.run(
            _serve_step(base_url, model, requests, watch.deadline_s, watch, sample if gauge else None)
        )
        after = scrape_metrics(client, base_url)
    duration = ended - started
    unreleased = sum(1 for r in requests if r.arrival_s is not None and r.arrival_s > duration)
    supply.give_back(unreleased)
    # requests still running keep the first token heard, as the monitor saw them
    rows = [dict(r) for r in _rows(records, requests, started, duration, firsts)]
    gaps = [gap for r in records if r.error is None for gap in itl_ms(r)]
    server = adapter.server_stats(before, after) if adapter is not None and before and after else {}
    return watch.ended(rows, gaps, duration, reason, server, replayed)


def judge_served(m: Measured, slo: Mapping[str, float], plan: CapacityPlan, rate: float | None = None) -> Step:
    """A served step judged under one tier's ``slo``, as a capacity search judges it: over the send
    times its looks counted (``window_s``: a step a look stopped leaves its last requests in flight,
    and those are not misses), at the plan's look quantile, failing where its queue kept growing. A
    step the monitor cut (saturated, or collapsed under every tier) never passes, and says so, since
    its end-of-step figures alone may look like a pass. The one definition: the search and the
    benchmarks' fixed ladders (``tests/benchmarks``) judge through it."""
    step = summarize_step(
        m.rate_req_s if rate is None else rate, m.rows, slo, plan.target, m.duration_s, itl_ms=m.itl_ms,
        server=m.server, window_s=m.window_s, z=plan.z, queue_growing=m.queue_growing,
    )  # fmt: skip
    step = replace(step, replayed=m.replayed, held=m.held)
    if m.aborted:
        step = replace(step, passed=False, cut_s=round(m.duration_s, 2), cut_reason=m.cut_reason)
    return step


def search_capacity(
    measure: Callable[..., Measured],
    plan: CapacityPlan,
    incumbents: Mapping[str, float] | None = None,
    prune: bool = True,
    said: Callable[[str, Measured, str], None] | None = None,
    keep_on_interrupt: bool = False,
) -> CapacityOutcome:
    """Every tier's search (the scored tiers first), measuring each rate once across tiers (and again,
    served whole, where a tier confirms a claim a look passed early: ``measure(rate, hold=True)``). With
    ``keep_on_interrupt``, Ctrl-C (or SIGTERM, which the CLI turns into one) ends it with what was
    judged so far (``interrupted``; the step being served is lost) instead of raising: a drive's
    minutes of steps are kept. A trial raises, so that it is marked failed."""
    started = time.monotonic()
    by_rate: dict[float, list[Measured]] = {}  # every step served at each rate, in order
    served: list[Measured] = []  # every step served, in order
    searches: dict[str, CapacitySearch] = {}
    interrupted = False
    try:
        _search_tiers(measure, plan, incumbents or {}, prune, said, by_rate, served, searches)
    except KeyboardInterrupt:
        if not keep_on_interrupt:
            raise
        interrupted = True
        for search in searches.values():
            if search.stop_reason is None:  # the tier being searched: every other one has stopped
                search.stop_reason = "interrupted"
    results = {tier: search.result() for tier, search in searches.items()}
    return CapacityOutcome(results, served, time.monotonic() - started, interrupted)


def _search_tiers(
    measure: Callable[..., Measured], plan: CapacityPlan, incumbents: Mapping[str, float], prune: bool,
    said: Callable[[str, Measured, str], None] | None, by_rate: dict[float, list[Measured]],
    served: list[Measured], searches: dict[str, CapacitySearch],
) -> None:  # fmt: skip
    """``search_capacity``'s loop, filling ``by_rate`` and ``searches`` (one per tier, in order) as it goes.

    A tier reads every step served at a rate that it has not read yet, in the order served: a step a
    look passed early and the same rate served whole to confirm it are both the looser tier's too. Read
    only the latest, a looser tier lost the early pass a stricter one's claim stood on, and could claim
    less than the stricter tier from the same servings (reports/gpu-h100/study-1/block16/NOTES.md)."""
    order = list(plan.scored) + [t for t in plan.tiers if t not in plan.scored]
    for tier in order:
        if tier not in plan.scored:
            continue  # only the scored tiers are searched: an unscored tier's steps would cost boots' time
        slo = plan.tiers[tier]
        search = searches[tier] = plan.search(incumbents.get(tier), prune)
        read: dict[float, int] = {}  # how many of each rate's steps this tier has read
        while (rate := search.next_rate()) is not None:
            key = round(rate, 6)
            kept = by_rate.setdefault(key, [])
            # a step to serve whole (a claim's confirmation) is served again, unless one served whole
            # stands for the rate already
            fresh = not kept or (search.whole and not any(m.held for m in kept))
            if fresh:
                kept.append(measure(rate, hold=True) if search.whole else measure(rate))
                served.append(kept[-1])
            for m in kept[read.get(key, 0) :]:
                latest = m is kept[-1]
                step = judge_served(m, slo, plan, rate)
                search.record(step, measured=fresh and latest)
                if said is not None:
                    said(tier, m, _said_step(step, search, latest))
            read[key] = len(kept)


def _said_step(step: Step, search: CapacitySearch, latest: bool) -> str:
    """How the search log says a tier judged a step; ``latest``: the step this proposal served or read
    last (an earlier one at the rate is one a look decided early, read by a later tier beside the
    rate's whole serving)."""
    why = f": {step.cut_reason}" if step.cut_reason else ""
    cut = f" (cut at {step.cut_s:.0f} s{why})" if step.cut_s is not None else ""
    interval = f" [{step.attainment_low:.0%}, {step.attainment_high:.0%}]" if step.attainment_low is not None else ""
    extra = "".join((
        ", served whole to confirm the claim" if latest and search.confirming else "",
        ", served whole" if latest and search.whole and not search.confirming else "",
        ", decided early by a look" if not latest else "",
        ", queue growing" if step.queue_growing else "",
        f", {step.replayed} replayed" if step.replayed else "",
    ))  # fmt: skip
    return f"{step.attainment:.0%}{interval} {step.verdict}{cut}{extra}"
