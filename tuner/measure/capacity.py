"""Capacity search: the highest Poisson rate (req/s) a config carries while enough requests meet the SLO.

A *step* serves one rate for a fixed duration; its *attainment* is the share of steady-window requests
that met every SLO bound (DistServe-style: each request is judged against each bound, failures are
misses). A step *passes* when attainment >= target and the server is not saturated. ``CapacitySearch``
is a pure state machine that proposes rates and is fed the measured steps, so the I/O side drives it
and tests can drive it with synthetic curves.

Rules, chosen so the answer is conservative and the search always ends:

- steady window: requests sent in the first and the last ``STEADY_TRIM`` of the step's duration are
  ramp-up and drain; they count for throughput but not for attainment.
- saturation: the number of requests in flight, sampled across the steady window, grows with a
  least-squares slope above ``SATURATION_SHARE`` of the arrival rate, and by more than Poisson noise
  moves it (``SATURATION_RISE`` requests, or three square roots of the mean in flight, whichever is
  more): completions lag arrivals, so the queue never settles. In-flight climbs to its level for as
  long as a request lives, and a request lives longer as the batch it joins grows, so growth is
  judged only from one lifetime after the first send (the ``SETTLE_QUANTILE`` of the lifetimes of
  every request ended so far, ``settled_from``), mid-step only over at least ``MIN_WATCH_S`` from
  there, and only when in-flight grows over each third of that window as well as over the whole: a
  load-dependent batch wanders by far more than Poisson noise, and one wander, or a burst of arrivals
  that slows the batch it joins, reads as a slope over a window and often over both of its halves,
  rarely over all three of its thirds (reports/capacity.md, sections "The saturation test" and "The
  search on a known server"). Mid-step it is judged every ``SATURATION_EVERY_S``, not at every tick
  of the monitor: each judgement is another chance for a wander to read as a pile-up, and a cut is
  final: judged at every tick, four times a second, it cut more steps of a rate the server carries
  (the same section measures both).
- decided, not drawn: a step's attainment is a proportion with an interval (``attainment_interval``).
  It passes only when the interval's lower end is at or above the target, and fails only when its
  upper end is below it; otherwise it is *undecided*, and the step goes on serving (up to its limit)
  until it is decided. A step still undecided at its limit is recorded as undecided and never counts
  as a pass, so a capacity is always a decided pass. Where the search goes next follows its
  attainment (``leans_pass``): an undecided step below the target caps the search as a fail does; one
  at or above it does not, and the search climbs past it. Near the knee many steps end undecided, and
  one of them, taken for a fail, used to halve the search on a draw (reports/gpu-h200/capacity-check-6).
  The requests of one step are not independent (a burst delays its neighbours), so the interval is
  widened by the design effect that batch means over consecutive requests show, and its confidence
  is split over the looks a step may take (Bonferroni).
- steady state: a step also fails when the server's waiting queue, sampled through the step, keeps
  growing (``queue_growing``): the rate is not carried, whatever the requests so far say.
- non-monotone curves: ``capacity_req_s`` is the highest passing rate *below the lowest fail* (a step
  that did not pass and does not lean to a pass); a pass above a fail does not count. The search
  bisects between the highest rate that passed or leans to a pass and that fail, then, where the top
  of that bracket was undecided, between the capacity and the lowest rate above it that did not
  pass, which every capacity records as ``bracket_req_s``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tuner.errors import ConfigError

SLO_KEYS = ("ttft_p95_ms", "tpot_p95_ms", "e2e_p95_ms")
STEADY_TRIM = 0.10  # share of the step's duration dropped at each end as ramp-up and drain
SATURATION_SHARE = 0.10  # in-flight growth, as a share of the arrival rate, that means the queue never settles
SATURATION_RISE = 8.0  # fewest requests the in-flight count must rise by, so Poisson noise at low rates is no signal
SATURATION_SAMPLES = 32
# Poisson arrivals make in-flight wander by about its square root: a rise is believed above 3 of those.
SATURATION_SIGMAS = 3.0
SATURATION_PARTS = 3  # the judged window's parts, each of which must rise as well as the whole
# each part must rise by one and a half of them: a wander seldom keeps its direction over all the parts
# (a part holds a third of the rise, so two of them would miss a real pile-up for seconds longer)
PART_SIGMAS = 1.5
SETTLE_QUANTILE = 0.75  # of the lifetimes ended so far: how long in-flight climbs before it can be judged
MIN_LIVES = 5  # fewest ended requests whose lifetimes tell that climb
MIN_WATCH_S = 5.0  # mid-step, saturation is judged over at least this long after warm-up, never on a glimpse
SATURATION_EVERY_S = 5.0  # mid-step, saturation is judged at multiples of this (step time), not at every tick
FLOOR_DIVISOR = 8.0  # with no incumbent, halve down to start_rate / 8 before reporting no capacity
PRUNE_SHARE = 0.75  # with an incumbent c that fails, the rescue probe runs at PRUNE_SHARE * c
MIN_DECIDED = 20  # fewest decided requests before a mid-step collapse is believed
SATURATED, COLLAPSED = "saturated", "collapsed"  # why the monitor cut a step
PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"  # a step's decision
CONFIDENCE = 0.90  # the chance that a decided step is decided right, over all the looks it takes
ATTAINMENT_TARGET = 0.9  # the share of requests that must meet the SLO at a capacity (--attainment)
RESOLUTION = 0.10  # the capacity search's relative precision (--resolution)
BATCHES = 8  # consecutive-request batches the design effect is estimated from
MIN_BATCH = 5  # fewest requests a batch holds; with fewer than two such batches no design effect

Row = Mapping[str, Any]


def check_slo(slo: Mapping[str, float]) -> dict[str, float]:
    """The SLO as a plain dict, or a ConfigError naming the bad bound."""
    if not slo:
        raise ConfigError(f"--slo: give at least one bound of {', '.join(SLO_KEYS)}")
    for key, bound in slo.items():
        if key not in SLO_KEYS:
            raise ConfigError(f"--slo: unknown bound {key!r}; expected one of {', '.join(SLO_KEYS)}")
        if not (bound > 0 and math.isfinite(bound)):
            raise ConfigError(f"--slo {key}={bound}: the bound must be a positive, finite number of milliseconds")
    return {key: float(bound) for key, bound in slo.items()}


def meets_slo(ttft_ms: float, tpot_ms: float, e2e_ms: float | None, slo: Mapping[str, float]) -> bool:
    """Whether one request is within every bound; an e2e bound with no e2e time is a miss."""
    measured = {"ttft_p95_ms": ttft_ms, "tpot_p95_ms": tpot_ms, "e2e_p95_ms": e2e_ms}
    return all((value := measured[key]) is not None and value <= bound for key, bound in slo.items())


def request_ms(row: Row) -> tuple[float, float, float] | None:
    """(ttft, tpot, e2e) of a request row in ms, or None when it failed or never finished."""
    if row.get("error") is not None or row.get("first_s") is None or row.get("done_s") is None:
        return None
    ttft = (float(row["first_s"]) - float(row["sent_s"])) * 1e3
    e2e = (float(row["done_s"]) - float(row["sent_s"])) * 1e3
    tokens = int(row.get("output_tokens") or 0)
    return ttft, (e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0, e2e


def attainment_of(
    ttft_ms: Sequence[float], tpot_ms: Sequence[float], slo: Mapping[str, float], e2e_ms: Sequence[float] | None = None
) -> float:
    """Share of requests within the SLO from parallel per-request lists (captures without rows)."""
    if len(tpot_ms) != len(ttft_ms) or (e2e_ms is not None and len(e2e_ms) != len(ttft_ms)):
        raise ValueError("attainment_of: per-request lists differ in length")
    if not ttft_ms:
        return 0.0
    e2e: Sequence[float | None] = e2e_ms if e2e_ms is not None else [None] * len(ttft_ms)
    good = sum(meets_slo(a, b, c, slo) for a, b, c in zip(ttft_ms, tpot_ms, e2e, strict=True))
    return good / len(ttft_ms)


def look_z(looks: int, confidence: float = CONFIDENCE) -> float:
    """The one-sided normal quantile each look uses, so that all ``looks`` together stay within
    ``1 - confidence`` of a wrong decision (only one of the two errors is possible at a true rate)."""
    if looks < 1 or not 0 < confidence < 1:
        raise ValueError("look_z: need looks >= 1 and 0 < confidence < 1")
    return statistics.NormalDist().inv_cdf(1.0 - (1.0 - confidence) / looks)


def design_effect(outcomes: Sequence[bool]) -> float:
    """How much the variance of the share of successes exceeds the independent (binomial) one,
    from batch means over consecutive requests; at least 1, at most a batch's size."""
    n = len(outcomes)
    size = max(MIN_BATCH, n // BATCHES)
    batches = n // size
    share = sum(outcomes) / n if n else 0.0
    if batches < 2 or share in (0.0, 1.0):
        return 1.0
    means = [sum(outcomes[i * size : (i + 1) * size]) / size for i in range(batches)]
    effect = size * statistics.variance(means) / (share * (1.0 - share))
    return min(max(effect, 1.0), float(size))


def attainment_interval(outcomes: Sequence[bool], z: float) -> tuple[float, float]:
    """Wilson score interval of the share of ``outcomes`` that met the SLO, in send order, over the
    effective number of requests (``design_effect``); (0, 1) when there are none."""
    n = len(outcomes)
    if n == 0:
        return 0.0, 1.0
    share = sum(outcomes) / n
    n_eff = n / design_effect(outcomes)
    z2 = z * z
    centre = (share + z2 / (2 * n_eff)) / (1 + z2 / n_eff)
    half = z / (1 + z2 / n_eff) * math.sqrt(share * (1 - share) / n_eff + z2 / (4 * n_eff * n_eff))
    # the interval holds the share; at 0 or 1 rounding alone could put an end a hair past it
    return max(0.0, min(centre - half, share)), min(1.0, max(centre + half, share))


def decide(low: float, high: float, target: float) -> str:
    """``PASS`` when the whole interval is at or above the target, ``FAIL`` when it is below."""
    if low >= target:
        return PASS
    return FAIL if high < target else UNDECIDED


def resolved_until(rows: Sequence[Row], slo: Mapping[str, float], start_s: float, now_s: float) -> float:
    """The latest send time c such that every request sent in [start_s, c] has an outcome under ``slo``
    now: done, failed, or already past an e2e bound. Counting only those keeps a mid-step look
    unbiased: the requests still running are the slow ones."""
    open_sends = [
        float(row["sent_s"]) for row in rows if float(row["sent_s"]) >= start_s and not _known(row, slo, now_s)
    ]
    sent = [float(row["sent_s"]) for row in rows if start_s <= float(row["sent_s"]) <= now_s]
    if not open_sends:
        return max(sent, default=start_s)
    first_open = min(open_sends)
    return max((t for t in sent if t < first_open), default=start_s)


def _known(row: Row, slo: Mapping[str, float], now_s: float) -> bool:
    # A running request's outcome is known early only as a miss: a bound already passed (its first
    # token late, or not there yet past the TTFT bound, or the e2e bound gone by).
    if row.get("error") is not None or row.get("done_s") is not None:
        return True
    return _past_a_bound(row, slo, now_s)


def _past_a_bound(row: Row, slo: Mapping[str, float], now_s: float) -> bool:
    """Whether a request still running has already missed ``slo``, whatever happens next."""
    sent, first = float(row["sent_s"]), row.get("first_s")
    ttft_ms = ((now_s if first is None else float(first)) - sent) * 1e3
    return ttft_ms > slo.get("ttft_p95_ms", math.inf) or (now_s - sent) * 1e3 > slo.get("e2e_p95_ms", math.inf)


def outcomes_in(rows: Iterable[Row], slo: Mapping[str, float], start_s: float, end_s: float) -> list[bool]:
    """Whether each request sent in [start_s, end_s] met ``slo``, in send order (unfinished: a miss)."""
    window = sorted((row for row in rows if start_s <= float(row["sent_s"]) <= end_s), key=lambda r: float(r["sent_s"]))
    return [(t := request_ms(row)) is not None and meets_slo(*t, slo) for row in window]


def steady_rows(rows: Iterable[Row], duration_s: float, trim: float = STEADY_TRIM) -> list[Row]:
    """Requests sent inside [trim * duration, (1 - trim) * duration]: the ones attainment counts."""
    start, end = trim * duration_s, (1.0 - trim) * duration_s
    return [row for row in rows if start <= float(row["sent_s"]) <= end]


def _end_s(row: Row) -> float:
    # A request with no done time is still in flight unless it failed; a failure's end is unknown,
    # so it is taken as leaving at once rather than inflating the queue.
    if row.get("done_s") is not None:
        return float(row["done_s"])
    return math.inf if row.get("error") is None else float(row["sent_s"])


def settled_from(rows: Sequence[Row], start_s: float, end_s: float) -> float | None:
    """When the requests in flight should have reached their level, no sooner than ``start_s``.

    In-flight climbs for as long as a request lives, at any rate, and lifetimes grow with the batch
    they join, so the first requests (which met an empty server) understate the climb. It is read
    from every request that ended by ``end_s``: the ``SETTLE_QUANTILE`` of their lifetimes, after the
    first send. At a rate the server cannot carry, lifetimes grow with the queue and the ended ones
    lag it, so the window stays open but shorter. None until ``MIN_LIVES`` requests have ended."""
    first = min(float(r["sent_s"]) for r in rows)
    lives = [
        float(r["done_s"]) - float(r["sent_s"])
        for r in rows
        if r.get("done_s") is not None and float(r["done_s"]) <= end_s
    ]
    if len(lives) < MIN_LIVES:
        return None
    return max(start_s, first + float(np.quantile(lives, SETTLE_QUANTILE)))


def saturated(
    rows: Sequence[Row],
    start_s: float,
    end_s: float,
    *,
    share: float = SATURATION_SHARE,
    min_rise: float = SATURATION_RISE,
    min_span_s: float = 0.0,
) -> bool:
    """Whether in-flight requests keep piling up over [start_s, end_s], judged from when they should
    have settled (``settled_from``) and over at least ``min_span_s``: growing over the window and over
    each of its ``SATURATION_PARTS`` parts. With end_s = now it works mid-step."""
    settled = settled_from(rows, start_s, end_s) if rows else None
    if settled is None:
        return False
    span = end_s - settled
    if span <= 0 or span < min_span_s:
        return False
    sent = np.array([float(row["sent_s"]) for row in rows])
    ends = np.array([_end_s(row) for row in rows])

    def in_flight(a: float, b: float) -> tuple[np.ndarray, np.ndarray, float]:
        times = np.linspace(a, b, SATURATION_SAMPLES)
        counts = ((sent[None, :] <= times[:, None]) & (ends[None, :] > times[:, None])).sum(axis=1)
        return times, counts.astype(float), float(((sent >= a) & (sent <= b)).sum()) / (b - a)

    if not growing(*in_flight(settled, end_s), share=share, min_rise=min_rise):
        return False
    # each part must rise too, past a lower bar (a part of the window holds its part of the rise)
    edges = np.linspace(settled, end_s, SATURATION_PARTS + 1)
    return all(
        growing(*in_flight(a, b), share=share, min_rise=min_rise / SATURATION_PARTS, sigmas=PART_SIGMAS)
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    )


def growing(
    times: Sequence[float] | np.ndarray, counts: Sequence[float] | np.ndarray, arrival_rate: float, *,
    share: float = SATURATION_SHARE, min_rise: float = SATURATION_RISE, sigmas: float = SATURATION_SIGMAS,
) -> bool:  # fmt: skip
    """Whether a count of requests (in flight, or waiting in the server's queue) sampled at ``times``
    keeps rising: a least-squares slope above ``share`` of the arrival rate, and a rise over the span
    beyond what Poisson noise gives it."""
    if len(times) < 3:
        return False
    t, y = np.asarray(times, dtype=float), np.asarray(counts, dtype=float)
    span = float(t[-1] - t[0])
    if span <= 0:
        return False
    slope = float(np.polyfit(t, y, 1)[0])
    rise_needed = max(min_rise, sigmas * math.sqrt(max(float(y.mean()), 1.0)))
    return slope * span >= rise_needed and slope > share * arrival_rate


def collapsed(attainment: float, target: float) -> bool:
    """A clear fail: attainment under half the target, far from the edge, so the step can stop early."""
    return attainment < target / 2


def should_abort(rows: Sequence[Row], slo: Mapping[str, float], target: float, now_s: float, warmup_s: float) -> bool:
    """Mid-step: saturated, or the requests already decided after warm-up have collapsed attainment."""
    return cut_reason(rows, slo, target, now_s, warmup_s) is not None


def saturation_due(last_s: float, now_s: float, every_s: float = SATURATION_EVERY_S) -> bool:
    """Whether a multiple of ``every_s`` lies in (``last_s``, ``now_s``]: the monitor's ticks at which
    the saturation test is judged (every tick where ``every_s`` is 0)."""
    return every_s <= 0 or math.floor(now_s / every_s) > math.floor(last_s / every_s)


def cut_reason(
    rows: Sequence[Row], slo: Mapping[str, float], target: float, now_s: float, warmup_s: float,
    *, judge_saturation: bool = True,
) -> str | None:  # fmt: skip
    """Why a step should stop now (``SATURATED`` or ``COLLAPSED``), or None to go on. Stored on the step,
    since the figures at its end are judged over another window and may show neither. Saturation only
    where ``judge_saturation`` (the monitor: ``saturation_due``)."""
    if judge_saturation and saturated(rows, warmup_s, now_s, min_span_s=MIN_WATCH_S):
        return SATURATED
    good = bad = 0
    for row in rows:
        if float(row["sent_s"]) < warmup_s:
            continue
        times = request_ms(row)
        if times is not None:
            good, bad = (good + 1, bad) if meets_slo(*times, slo) else (good, bad + 1)
        elif row.get("error") is not None or _past_a_bound(row, slo, now_s):
            bad += 1  # failed, or still running but already past a bound: a miss whatever happens next
    return COLLAPSED if good + bad >= MIN_DECIDED and collapsed(good / (good + bad), target) else None


def _pct(values: Sequence[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    p50, p95 = np.percentile(np.asarray(values, dtype=float), [50, 95])
    return float(p50), float(p95)


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@dataclass(frozen=True)
class Step:
    """One rate served for one duration; ``passed`` is what the search reads."""

    rate_req_s: float
    attainment: float
    passed: bool
    saturated: bool = False
    collapsed: bool = False
    n_requests: int = 0
    n_counted: int = 0
    n_errors: int = 0
    duration_s: float = 0.0
    ttft_p50_ms: float | None = None
    ttft_p95_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p95_ms: float | None = None
    request_throughput_req_s: float = 0.0
    output_throughput_tok_s: float = 0.0
    server: dict[str, float | None] = field(default_factory=dict)
    cut_s: float | None = None  # the monitor stopped the step this many seconds in (it then never passes)
    cut_reason: str | None = None  # and why: SATURATED, or COLLAPSED under every tier
    attainment_low: float | None = None  # the attainment's interval (``attainment_interval``)
    attainment_high: float | None = None
    decision: str | None = None  # PASS, FAIL or UNDECIDED by the interval alone (None: a point judgement)
    window_s: tuple[float, float] | None = None  # the send times attainment counted, s after the step's start
    queue_growing: bool = False  # the server's waiting queue kept growing through the step
    replayed: int = 0  # requests of a finite trace sent again in this search, its order kept
    held: bool = True  # served its whole length; False: a look passed it early (its claim is then confirmed)

    @property
    def verdict(self) -> str:
        """The step as the search's log tells it: "pass", "undecided" (its interval straddles the
        target), or "fail" (what else did not pass: a decided fail, a cut)."""
        return PASS if self.passed else UNDECIDED if self.decision == UNDECIDED else FAIL

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: non-finite numbers become None (it is stored as a trial user attribute)."""
        out = asdict(self)
        out["server"] = {key: _finite(value) for key, value in self.server.items()}
        return {key: _finite(value) if isinstance(value, float) else value for key, value in out.items()}


def leans_pass(step: Step, target: float) -> bool:
    """Whether a step that did not pass was only undecided, at or above the target, and otherwise
    clean (not cut, not saturated, its queue not growing): the search climbs past it, but it is
    never a capacity."""
    clean = not (step.saturated or step.queue_growing or step.cut_reason is not None)
    return not step.passed and step.decision == UNDECIDED and step.attainment >= target and clean


def lowest_not_passed(steps: Iterable[Step], above: float = 0.0) -> float | None:
    """The lowest rate above ``above`` whose step did not pass (a fail or an undecided step), or None."""
    return min((s.rate_req_s for s in steps if not s.passed and s.rate_req_s > above), default=None)


def judged_step(rate_req_s: float, attainment: float, target: float, *, is_saturated: bool = False) -> Step:
    """A Step from an attainment alone, for captures without request rows and for synthetic curves."""
    passed = attainment >= target and not is_saturated
    return Step(rate_req_s, attainment, passed, is_saturated, collapsed(attainment, target))


def summarize_step(
    rate_req_s: float,
    rows: Sequence[Row],
    slo: Mapping[str, float],
    target: float,
    duration_s: float,
    *,
    itl_ms: Sequence[float] = (),
    server: Mapping[str, float | None] | None = None,
    trim: float = STEADY_TRIM,
    window_s: tuple[float, float] | None = None,
    z: float | None = None,
    queue_growing: bool = False,
) -> Step:
    """Judge one step: attainment over the send times ``window_s`` counts (default: the steady window,
    ``trim`` of the duration dropped at each end), with its interval and decision (``z``: the quantile
    of the step's looks, ``CapacityPlan.z``; default one look at ``CONFIDENCE``); percentiles over its successful
    requests; throughput over all requests and the whole duration. It passes only when decided so,
    not saturated and its queue was not growing."""
    if duration_s <= 0:
        raise ValueError("summarize_step: duration_s must be positive")
    start, end = window_s if window_s is not None else (trim * duration_s, (1.0 - trim) * duration_s)
    counted = [row for row in rows if start <= float(row["sent_s"]) <= end]
    outcomes = outcomes_in(counted, slo, start, end)
    judged = [(t, int(row.get("output_tokens") or 0)) for row in counted if (t := request_ms(row)) is not None]
    times = [t for t, _ in judged]
    attainment = sum(outcomes) / len(outcomes) if outcomes else 0.0
    low, high = attainment_interval(outcomes, look_z(1) if z is None else z)
    decision = decide(low, high, target)
    is_saturated = saturated(rows, trim * duration_s, (1.0 - trim) * duration_s)
    ok = [row for row in rows if request_ms(row) is not None]
    # TPOT is undefined for one-token answers: their 0.0 judges them but would drag percentiles down.
    tpots = [t[1] for t, tokens in judged if tokens > 1]
    (ttft50, ttft95), (tpot50, tpot95) = _pct([t[0] for t in times]), _pct(tpots)
    (itl50, itl95), (e2e50, e2e95) = _pct(itl_ms), _pct([t[2] for t in times])
    return Step(
        rate_req_s=rate_req_s,
        attainment=attainment,
        passed=decision == PASS and not is_saturated and not queue_growing,
        saturated=is_saturated,
        collapsed=collapsed(attainment, target),
        n_requests=len(rows),
        n_counted=len(counted),
        n_errors=sum(row.get("error") is not None for row in rows),
        duration_s=duration_s,
        ttft_p50_ms=ttft50,
        ttft_p95_ms=ttft95,
        tpot_p50_ms=tpot50,
        tpot_p95_ms=tpot95,
        itl_p50_ms=itl50,
        itl_p95_ms=itl95,
        e2e_p50_ms=e2e50,
        e2e_p95_ms=e2e95,
        request_throughput_req_s=len(ok) / duration_s,
        output_throughput_tok_s=sum(int(row.get("output_tokens") or 0) for row in ok) / duration_s,
        server=dict(server or {}),
        attainment_low=low,
        attainment_high=high,
        decision=decision,
        window_s=(round(start, 3), round(end, 3)),
        queue_growing=queue_growing,
    )


@dataclass(frozen=True)
class CapacityResult:
    """The search's answer and the whole measured curve, in the order measured."""

    capacity_req_s: float
    steps: tuple[Step, ...]
    stop_reason: str
    pruned: bool
    target: float
    resolution: float

    @property
    def bracket_req_s(self) -> tuple[float, float | None]:
        """(the capacity, the lowest rate above it that did not pass; None if none did not)."""
        return self.capacity_req_s, lowest_not_passed(self.steps, above=self.capacity_req_s)

    def at_capacity(self) -> Step | None:
        """The step the capacity was decided at (None when nothing passed)."""
        index = self.at_capacity_index()
        return None if index is None else self.steps[index]

    def at_capacity_index(self) -> int | None:
        """Where in ``steps`` the capacity was decided: the passing step at the capacity's rate, the one
        that held its whole length where a look passed the rate early first. The one definition: the
        stored record keeps this index (``at_step``) for readers of the study."""
        at = [i for i, s in enumerate(self.steps) if s.passed and s.rate_req_s == self.capacity_req_s]
        return next((i for i in at if self.steps[i].held), at[0] if at else None)

    def as_dict(self) -> dict[str, Any]:
        at = self.at_capacity()
        return {
            "capacity_req_s": self.capacity_req_s,
            "bracket_req_s": list(self.bracket_req_s),
            "at_step": self.at_capacity_index(),
            "attainment_interval": None if at is None else [at.attainment_low, at.attainment_high],
            "stop_reason": self.stop_reason,
            "pruned": self.pruned,
            "target": self.target,
            "resolution": self.resolution,
            "steps": [step.as_dict() for step in self.steps],
        }


class CapacitySearch:
    """Proposes rates: grow geometrically while steps pass, then bisect (geometric midpoint) between
    the highest pass below the lowest fail and that fail until their gap is within ``resolution``.

    With an ``incumbent`` capacity c it starts at c, then c * (1 + resolution), so a config no better
    than the incumbent is bracketed in two steps; if c fails and ``PRUNE_SHARE`` * c fails too, it is pruned
    (unless ``prune`` is off: then it halves down as a search without an incumbent does).

    A capacity is a pass that held for a step's whole length. A look may pass a step early, which is
    enough to climb past it; but before the search stops on a capacity whose step a look passed
    early, it serves that rate again to its end (``confirming``; the caller serves a step whole when
    ``whole`` says so, looks deciding only fails). The claim stands if that step upholds it: it
    passed, or it is undecided at or above the target and clean (``leans_pass``). Otherwise that step
    stands for the rate, the search goes on below it, and from then on serves every step whole: the
    early looks have been shown to flatter this server. At the knee the queue can build after a look
    has passed: on the CPU build a step passed at its first look, and the same rate served for the length
    ``tuner verify`` runs did not hold (reports/capacity.md, section "Capacity you can trust"). A
    confirmation is not counted against ``max_steps``: a search never stops on a claim it has not
    served whole.
    """

    def __init__(
        self,
        target: float = ATTAINMENT_TARGET,
        resolution: float = RESOLUTION,
        start_rate: float = 1.0,
        growth: float = 2.0,
        incumbent: float | None = None,
        max_steps: int = 12,
        max_rate: float | None = None,
        prune: bool = True,
    ) -> None:
        if not 0 < target <= 1:
            raise ConfigError(f"--attainment {target}: must be in (0, 1]")
        if not resolution > 0:
            raise ConfigError(f"--resolution {resolution}: must be positive")
        if not growth > 1:
            raise ConfigError(f"--growth {growth}: must be greater than 1")
        if not start_rate > 0:
            raise ConfigError(f"--start-rate {start_rate}: must be positive")
        if max_steps < 1:
            raise ConfigError(f"--max-steps {max_steps}: must be at least 1")
        if max_rate is not None and not max_rate >= start_rate:
            raise ConfigError(f"--max-rate {max_rate}: must be at least the start rate {start_rate}")
        self.target, self.resolution, self.growth, self.max_steps = target, resolution, growth, max_steps
        self.start_rate, self.max_rate = start_rate, max_rate if max_rate is not None else math.inf
        self.incumbent = min(incumbent, self.max_rate) if incumbent is not None and incumbent > 0 else None
        self.prune = prune  # False for a finalist's repeat: it starts at its own capacity and is never cut short
        self.steps: list[Step] = []
        self.measured = 0  # the steps this search served itself: what max_steps bounds
        self.stop_reason: str | None = None
        self.confirming = False  # the rate next_rate gave is a claim's confirmation
        self.whole = False  # the rate next_rate gave is to be served whole: a confirmation, or any step
        # once a confirmation refuted its claim
        self.misled = False  # a confirmation refuted its claim: the looks' early passes flatter this server

    def _upheld(self, step: Step) -> bool:
        """Whether a step served whole upholds a look's early pass at its rate: it passed, or it is
        undecided at or above the target and clean (``leans_pass``): nothing in it refutes the pass."""
        return step.passed or leans_pass(step, self.target)

    def judged(self) -> list[Step]:
        """The steps the search reads: a rate served whole stands for that rate, so the steps a look
        ended early at a rate later served whole are left out, unless the whole step upholds them."""
        refuted = {s.rate_req_s for s in self.steps if s.held and not self._upheld(s)}
        return [s for s in self.steps if s.held or s.rate_req_s not in refuted]

    def lowest_fail(self) -> float | None:
        """The lowest rate that did not pass and does not lean to a pass (``leans_pass``): the ceiling."""
        fails = [s.rate_req_s for s in self.judged() if not s.passed and not leans_pass(s, self.target)]
        return min(fails) if fails else None

    def _leaning(self, ceiling: float | None) -> float:
        """The highest rate below ``ceiling`` that passed or leans to a pass: where the knee is above."""
        leaning = [
            s.rate_req_s for s in self.judged()
            if self._upheld(s) and (ceiling is None or s.rate_req_s < ceiling)
        ]  # fmt: skip
        return max(leaning, default=0.0)

    def capacity(self) -> float:
        """Highest passing rate below the lowest failing rate, or 0.0 when none passed there."""
        ceiling = self.lowest_fail()
        passes = [s.rate_req_s for s in self.judged() if s.passed and (ceiling is None or s.rate_req_s < ceiling)]
        return max(passes, default=0.0)

    def _unconfirmed(self) -> float | None:
        """The capacity, where only a look passed it early so far (it is served whole next), else None."""
        best = self.capacity()
        at = [s for s in self.judged() if s.passed and s.rate_req_s == best]
        # served once already and still not whole (a caller that cannot serve a step whole, such as a
        # replay of recorded steps): asking again would loop
        served = [s for s in self.steps if s.rate_req_s == best]
        upheld = any(s.held and self._upheld(s) for s in served)
        return best if at and not upheld and len(served) < 2 else None

    def record(self, step: Step, measured: bool = True) -> None:
        """Add a step; ``measured=False`` for a rate another tier's search already served, which
        cost nothing and so does not count against ``max_steps``. A step served whole that refutes a
        look's early pass at its rate (this search's confirmation, or another tier's read here after
        the early step) shows that the looks flatter this server."""
        early_pass = any(s.passed and not s.held and s.rate_req_s == step.rate_req_s for s in self.steps)
        if (self.confirming or step.held and early_pass) and not self._upheld(step):
            self.misled = True
        self.steps.append(step)
        self.measured += measured and not self.confirming

    def next_rate(self) -> float | None:
        """The next rate to measure, or None once the search has stopped (see ``result``)."""
        self.confirming = False
        self.whole = self.misled
        if self.stop_reason is not None:
            return None
        rate, reason = self._propose()
        if rate is not None and self.measured >= self.max_steps:
            rate, reason = None, "max_steps"
        if rate is not None and any(math.isclose(rate, s.rate_req_s) for s in self.steps):
            rate, reason = None, "stalled"  # only when the caller measured other rates than proposed
        if rate is None and (claim := self._unconfirmed()) is not None:
            self.confirming = self.whole = True  # it would stop on a pass a look decided early
            return claim
        self.stop_reason = reason
        return rate

    def _propose(self) -> tuple[float | None, str | None]:
        if not self.steps:
            return (self.incumbent if self.incumbent is not None else min(self.start_rate, self.max_rate)), None
        fail, best = self.lowest_fail(), self.capacity()
        leaning = self._leaning(fail)
        if fail is None and leaning < self.max_rate:  # still climbing, past undecided steps that lean to a pass
            step_up = 1 + self.resolution if self.incumbent is not None and len(self.steps) == 1 else self.growth
            return min(leaning * step_up, self.max_rate), None
        if fail is not None and leaning > best and (fail - leaning) / leaning > self.resolution:
            return math.sqrt(leaning * fail), None  # the knee lies above an undecided step: bisect up to it
        # the bracket that counts: the capacity (a decided pass) and the lowest rate above it not passed
        upper = lowest_not_passed(self.judged(), above=best)
        if best > 0:
            if upper is None:
                return None, "max_rate"
            if (upper - best) / best <= self.resolution:
                return None, "resolved"
            return self._between(best, upper), None
        if self.incumbent is not None and self.prune:  # nothing passed below the incumbent: one rescue probe
            rescued = any(s.rate_req_s < self.incumbent for s in self.steps)
            return (None, "pruned") if rescued else (PRUNE_SHARE * self.incumbent, None)
        lowest = lowest_not_passed(self.judged())
        assert lowest is not None  # steps were measured and none passed
        floor = min(self.start_rate, self.incumbent or self.start_rate) / FLOOR_DIVISOR
        rate = lowest / (1 + self.resolution) if self._near_knee(lowest) else lowest / 2
        return (rate, None) if rate >= floor * (1 - 1e-9) else (None, "no_capacity")

    def _between(self, best: float, upper: float) -> float:
        """The next rate inside the bracket (the capacity, the lowest rate above it not passed): its
        geometric midpoint. (tests/benchmarks/_previous_rules.py runs a candidate that differs here.)"""
        return math.sqrt(best * upper)

    def _near_knee(self, rate: float) -> bool:
        """Whether every step the search reads at ``rate`` leans to a pass (``leans_pass``): the knee is
        then within a resolution below it, so the search steps down by one (a pass there resolves the
        bracket) rather than halving and spending its steps climbing back. A finalist's repeat that
        halved below two such steps stopped on ``max_steps`` far under them
        (reports/gpu-h100/study-1/block12/NOTES.md)."""
        return all(leans_pass(s, self.target) for s in self.judged() if s.rate_req_s == rate and not s.passed)

    def result(self) -> CapacityResult:
        reason = self.stop_reason or "unfinished"
        return CapacityResult(
            self.capacity(), tuple(self.steps), reason, reason == "pruned", self.target, self.resolution
        )


def ladder_rates(low: float, high: float, resolution: float) -> list[float]:
    """A fixed geometric ladder from low to high whose neighbours are within ``resolution`` of each
    other: the rates a ladder must measure to match the search's precision."""
    if not 0 < low <= high:
        raise ConfigError(f"ladder {low}..{high}: need 0 < low <= high")
    if not resolution > 0:
        raise ConfigError(f"--resolution {resolution}: must be positive")
    n = math.ceil(math.log(high / low) / math.log1p(resolution) - 1e-9) if high > low else 0
    return [low * (high / low) ** (i / n) for i in range(n + 1)] if n else [low]
