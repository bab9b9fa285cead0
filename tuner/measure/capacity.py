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
  more): completions lag arrivals, so the queue never settles. Mid-step it is judged only over at
  least ``MIN_WATCH_S`` after warm-up, since in-flight climbs to its level in a step's first seconds.
- non-monotone curves: ``capacity_req_s`` is the highest passing rate *below the lowest failing rate*;
  a pass above a fail does not count, and the bisection bracket is (that pass, the lowest fail).
"""

from __future__ import annotations

import math
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
MIN_WATCH_S = 5.0  # mid-step, saturation is judged over at least this long after warm-up, never on a glimpse
FLOOR_DIVISOR = 8.0  # with no incumbent, halve down to start_rate / 8 before reporting no capacity
PRUNE_SHARE = 0.75  # with an incumbent c that fails, the rescue probe runs at 0.75 * c
MIN_DECIDED = 20  # fewest decided requests before a mid-step collapse is believed
SATURATED, COLLAPSED = "saturated", "collapsed"  # why the monitor cut a step

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


def saturated(
    rows: Sequence[Row],
    start_s: float,
    end_s: float,
    *,
    share: float = SATURATION_SHARE,
    min_rise: float = SATURATION_RISE,
) -> bool:
    """Whether in-flight requests keep piling up over [start_s, end_s]; with end_s = now it works mid-step."""
    span = end_s - start_s
    if span <= 0 or not rows:
        return False
    sent = np.array([float(row["sent_s"]) for row in rows])
    ends = np.array([_end_s(row) for row in rows])
    times = np.linspace(start_s, end_s, SATURATION_SAMPLES)
    in_flight = ((sent[None, :] <= times[:, None]) & (ends[None, :] > times[:, None])).sum(axis=1)
    slope = float(np.polyfit(times, in_flight.astype(float), 1)[0])
    arrival_rate = float(((sent >= start_s) & (sent <= end_s)).sum()) / span
    rise_needed = max(min_rise, SATURATION_SIGMAS * math.sqrt(max(float(in_flight.mean()), 1.0)))
    return slope * span >= rise_needed and slope > share * arrival_rate


def collapsed(attainment: float, target: float) -> bool:
    """A clear fail: attainment under half the target, far from the edge, so the step can stop early."""
    return attainment < target / 2


def should_abort(rows: Sequence[Row], slo: Mapping[str, float], target: float, now_s: float, warmup_s: float) -> bool:
    """Mid-step: saturated, or the requests already decided after warm-up have collapsed attainment."""
    return cut_reason(rows, slo, target, now_s, warmup_s) is not None


def cut_reason(
    rows: Sequence[Row], slo: Mapping[str, float], target: float, now_s: float, warmup_s: float
) -> str | None:
    """Why a step should stop now (``SATURATED`` or ``COLLAPSED``), or None to go on. Stored on the step,
    since the figures at its end are judged over another window and may show neither."""
    if now_s - warmup_s >= MIN_WATCH_S and saturated(rows, warmup_s, now_s):
        return SATURATED
    good = bad = 0
    for row in rows:
        if float(row["sent_s"]) < warmup_s:
            continue
        times = request_ms(row)
        age_ms = (now_s - float(row["sent_s"])) * 1e3
        if times is not None:
            good, bad = (good + 1, bad) if meets_slo(*times, slo) else (good, bad + 1)
        elif row.get("error") is not None:
            bad += 1
        elif (row.get("first_s") is None and age_ms > slo.get("ttft_p95_ms", math.inf)) or age_ms > slo.get(
            "e2e_p95_ms", math.inf
        ):
            bad += 1  # still running but already past a bound: a miss whatever happens next
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

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: non-finite numbers become None (it is stored as a trial user attribute)."""
        out = asdict(self)
        out["server"] = {key: _finite(value) for key, value in self.server.items()}
        return {key: _finite(value) if isinstance(value, float) else value for key, value in out.items()}


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
) -> Step:
    """Judge one step: attainment over the steady window, percentiles over its successful requests,
    throughput over all requests and the whole duration."""
    if duration_s <= 0:
        raise ValueError("summarize_step: duration_s must be positive")
    counted = steady_rows(rows, duration_s, trim)
    judged = [(t, int(row.get("output_tokens") or 0)) for row in counted if (t := request_ms(row)) is not None]
    times = [t for t, _ in judged]
    attainment = sum(meets_slo(*t, slo) for t in times) / len(counted) if counted else 0.0
    is_saturated = saturated(rows, trim * duration_s, (1.0 - trim) * duration_s)
    ok = [row for row in rows if request_ms(row) is not None]
    # TPOT is undefined for one-token answers: their 0.0 judges them but would drag percentiles down.
    tpots = [t[1] for t, tokens in judged if tokens > 1]
    (ttft50, ttft95), (tpot50, tpot95) = _pct([t[0] for t in times]), _pct(tpots)
    (itl50, itl95), (e2e50, e2e95) = _pct(itl_ms), _pct([t[2] for t in times])
    return Step(
        rate_req_s=rate_req_s,
        attainment=attainment,
        passed=attainment >= target and not is_saturated,
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

    def as_dict(self) -> dict[str, Any]:
        return {
            "capacity_req_s": self.capacity_req_s,
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
    than the incumbent is bracketed in two steps; if c fails and 0.75 * c fails too, it is pruned
    (unless ``prune`` is off: then it halves down as a search without an incumbent does).
    """

    def __init__(
        self,
        target: float = 0.9,
        resolution: float = 0.10,
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

    def lowest_fail(self) -> float | None:
        fails = [s.rate_req_s for s in self.steps if not s.passed]
        return min(fails) if fails else None

    def capacity(self) -> float:
        """Highest passing rate below the lowest failing rate, or 0.0 when none passed there."""
        ceiling = self.lowest_fail()
        passes = [s.rate_req_s for s in self.steps if s.passed and (ceiling is None or s.rate_req_s < ceiling)]
        return max(passes, default=0.0)

    def record(self, step: Step, measured: bool = True) -> None:
        """Add a step; ``measured=False`` for a rate another tier's search already served, which
        cost nothing and so does not count against ``max_steps``."""
        self.steps.append(step)
        self.measured += measured

    def next_rate(self) -> float | None:
        """The next rate to measure, or None once the search has stopped (see ``result``)."""
        if self.stop_reason is not None:
            return None
        rate, reason = self._propose()
        if rate is not None and self.measured >= self.max_steps:
            rate, reason = None, "max_steps"
        if rate is not None and any(math.isclose(rate, s.rate_req_s) for s in self.steps):
            rate, reason = None, "stalled"  # only when the caller measured other rates than proposed
        self.stop_reason = reason
        return rate

    def _propose(self) -> tuple[float | None, str | None]:
        if not self.steps:
            return (self.incumbent if self.incumbent is not None else min(self.start_rate, self.max_rate)), None
        fail, best = self.lowest_fail(), self.capacity()
        if fail is None:  # still climbing
            step_up = 1 + self.resolution if self.incumbent is not None and len(self.steps) == 1 else self.growth
            if best >= self.max_rate:
                return None, "max_rate"
            return min(best * step_up, self.max_rate), None
        if best > 0:  # bracketed: bisect until the gap is within the resolution
            if (fail - best) / best <= self.resolution:
                return None, "resolved"
            return math.sqrt(best * fail), None
        if self.incumbent is not None and self.prune:  # nothing passed below the incumbent: one rescue probe
            return (PRUNE_SHARE * self.incumbent, None) if len(self.steps) < 2 else (None, "pruned")
        floor = min(self.start_rate, self.incumbent or self.start_rate) / FLOOR_DIVISOR
        return (fail / 2, None) if fail / 2 >= floor * (1 - 1e-9) else (None, "no_capacity")

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
