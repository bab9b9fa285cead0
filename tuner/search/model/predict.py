"""A config's capacity before it boots: simulate the study's own workload through the fitted engine.

``EngineModel`` holds what a study's served trials taught (per engine the fitted costs, per draft
the acceptance, the workload's prefix-cache hit rate). To predict a config it serves simulated steps
as a capacity trial would (``tuner.measure.rate_steps``: the plan's request count at a rate, released
at the plan's seeded arrivals, the study's requests in order) through the simulated scheduler of that
config (its token budget and sequence limit from the adapter, its KV pool from the memory screen,
its speculation at the draft's acceptance), watches and judges each step by the rules of a real one
(``tuner.measure.rate_steps.watch_offline`` and ``judge_served``: its looks, the monitor's cuts, the
waiting queue the simulator reports, every SLO tier) and bisects the rate where steps stop passing.
A capacity search claims only a pass that held for a step's whole length (``hold``, as
``CapacitySearch`` confirms a look's early pass); a fixed ladder of steps, as the benchmarks' tables
were climbed, stops each step at the look that decided it (``hold=False``).

What the study has not measured is a range, not a guess:

* a draft never booted: its acceptance anywhere in [0, 1] and its own costs anywhere between nothing
  and the target's own (a draft is no slower than its target), so the capacity is the range those
  ends give. Where another engine of the study ran the draft, its acceptance is known (a fact of
  target, draft and workload, ``shared_acceptance``) and only the drafting costs span the range;
* the target alone, on an engine whose served steps all speculated: in each of them a target
  iteration came with its drafting passes and verify tokens in fixed proportion, so the fit cannot
  tell the target's per-iteration and per-sequence costs from the speculation's, and nothing bounds
  what the target carries alone. Its prediction is kept (the scheduler's own limits still rank such
  configs) but has no range: it is worth a boot, as an engine never booted is;
* an engine never booted: no prediction at all.

How far the model itself is off is the study's own record (``model_sigma``): each trial stores what
was predicted before it booted, so the spread of log(predicted / measured) over them is the model's
error on this engine, this machine and this workload.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from itertools import cycle, islice
from typing import Any

import numpy as np

from tuner.engines.base import Device, EngineAdapter
from tuner.engines.speculation import proposer_of
from tuner.measure.capacity import FLOOR_DIVISOR
from tuner.measure.rate_steps import CapacityPlan, Measured, judge_served, watch_offline
from tuner.search.model.fit import Fit, fit_costs
from tuner.search.model.history import (
    Served,
    draft_acceptance,
    draft_share,
    hit_rate,
    limits_of,
    observed,
    speculation,
    step_works,
)
from tuner.search.model.parallel import Workers, inherited
from tuner.search.model.requests import Shape, StudyRequests
from tuner.search.model.simulate import TARGET_FEATURES, Limits, Speculation, pool_blocks, simulate
from tuner.workloads.arrivals import Arrival, release_times

PRECISION = 0.02  # a predicted capacity is bisected this close: finer than any search resolution
MAX_DOUBLINGS = 10
PRIOR_SIGMA = 0.25  # the model's log error assumed until the study has MIN_RECORD predictions of its own
MIN_RECORD = 3
RANGE_POINTS = 9  # points a range is averaged over in the expected improvement
UNKNOWN_ACCEPTANCE = (0.0, 1.0)
NO_ACCEPTANCE = 0.0  # the acceptance a fit assumes for a step whose counters and draft say nothing
TICK_S = 0.5  # how often a simulated step's monitor looks: coarser than a real one's, for speed
MIN_PER_WORKER = 2  # fewer configs than this per worker are not worth a fork
SAME_SIMULATION_BUT = "memory_fraction"  # the parameter that changes only a config's KV pool

Job = tuple[str, Mapping[str, Any], int | None]  # engine, params, KV pool in tokens (None: unbounded)


@dataclass(frozen=True)
class Prediction:
    """What the model expects of a config under one tier: its capacity (req/s), the range the
    unmeasured parts of it allow (``low``..``high``; both the capacity where all is known), and why."""

    tier: str
    capacity_req_s: float | None
    low_req_s: float | None
    high_req_s: float | None
    basis: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class EngineModel:
    """A study's performance model: fitted from ``served`` trials, predicting for ``requests`` (the
    study's, in order, grown as a search grows them) under ``plan``. ``fits`` is filled by ``fit``."""

    adapters: Mapping[str, EngineAdapter]
    device: Device
    plan: CapacityPlan
    requests: StudyRequests
    fits: dict[str, Fit]
    acceptance: dict[str, dict[str, float]]
    hit: float
    trials: int
    plain: dict[str, bool] = field(default_factory=dict)  # per engine: some served step ran without speculation
    # per draft, its acceptance over every engine that ran it: a fact of target, draft and workload, so
    # an engine that never ran the draft starts from it (its drafting costs stay unknown)
    shared_acceptance: dict[str, float] = field(default_factory=dict)
    # a predicted capacity is a pass that held for a step's whole length, as a capacity search claims
    # one; False: a pass a look decided early stands, as on a fixed ladder of steps
    hold: bool = True
    # per engine and draft, the share of decode steps that proposed, where the counters said (else 1)
    shares: dict[str, dict[str, float]] = field(default_factory=dict)
    # capacities already simulated, by what the simulation reads but the KV pool: (pool in blocks, the
    # most blocks its steps asked for, capacities). Candidates that differ only in a pool none of their
    # steps filled are one simulation (``simulate``'s ``demand``)
    _simulated: dict[tuple[Any, ...], list[tuple[float, int, dict[str, float]]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def fit(
        cls, served: Sequence[Served], adapters: Mapping[str, EngineAdapter], device: Device, plan: CapacityPlan,
        requests: Sequence[Shape] | StudyRequests, start: Mapping[str, Fit] | None = None, hold: bool = True,
        workers: int = 1,
    ) -> EngineModel:  # fmt: skip
        """Fit every engine ``served`` holds (``start``: an earlier model's fits, to start from;
        ``requests``: the study's requests, or their shapes alone, sent again in order where a step
        needs more; ``workers``: processes the fit's simulations are spread over)."""
        fits, acceptance, plain, shares = {}, {}, {}, {}
        for engine in sorted({s.engine for s in served}):
            mine = [s for s in served if s.engine == engine]
            plain[engine] = any(speculation(s.params, 0.0) is None for s in mine)
            acceptance[engine] = draft_acceptance(mine, engine)
            shares[engine] = draft_share(mine, engine)
            steps = []
            for s in mine:
                proposer = proposer_of(s.params) or ""
                accept = acceptance[engine].get(proposer, NO_ACCEPTANCE)
                steps += observed(s, adapters[engine], device, accept, shares[engine].get(proposer, 1.0))
            fitted = fit_costs(steps, start=(start or {}).get(engine), workers=workers)
            if fitted is not None:
                fits[engine] = fitted
        hits = [hit_rate(step) for s in served for step in s.steps if "prefix_cache_hit_rate" in step.server]
        hit = float(np.median(hits)) if hits else 0.0
        pooled: dict[str, list[float]] = {}
        for per_draft in acceptance.values():
            for draft, value in per_draft.items():
                pooled.setdefault(draft, []).append(value)
        shared = {draft: float(np.median(values)) for draft, values in pooled.items()}
        study = requests if isinstance(requests, StudyRequests) else StudyRequests(requests)
        return cls(adapters, device, plan, study, fits, acceptance, hit, len(served), plain, shared, hold, shares)

    def predict(self, engine: str, params: Mapping[str, Any], kv_tokens: int | None) -> dict[str, Prediction]:
        """Every scored tier's predicted capacity for a config of ``engine`` with ``params`` and a KV
        pool of ``kv_tokens`` (None: unbounded)."""
        tiers = self.plan.scored
        fit = self.fits.get(engine)
        if fit is None or not self.requests:
            return {t: Prediction(t, None, None, None, f"{engine} never served a step in this study") for t in tiers}
        adapter = self.adapters[engine]
        limits = limits_of(params, adapter, self.device, kv_tokens)
        spec = speculation(params, 0.0)
        known = self.acceptance.get(engine, {})
        if (measured := self._as_measured(engine, fit, spec)) is not None:
            spec, theta = measured
            capacities = self._capacities(limits, theta, spec, fit.overhead_s)
            if spec is None and not self.plain.get(engine, True):
                why = f"{engine} never served without speculation: its target's own costs not told from drafting's"
                return {t: Prediction(t, c, None, None, why) for t, c in capacities.items()}
            why = f"fitted on {fit.steps} steps of {self.trials} trials"
            return {t: Prediction(t, c, c, c, why) for t, c in capacities.items()}
        # never booted: the ends of what it could be; its acceptance where another engine measured it
        assert spec is not None
        accept = known.get(spec.draft, self.shared_acceptance.get(spec.draft))
        slow_accept, fast_accept = UNKNOWN_ACCEPTANCE if accept is None else (accept, accept)
        slow = self._capacities(limits, _with_draft(fit, _as_slow_as_target(fit)),
                                replace(spec, accept=slow_accept), fit.overhead_s)  # fmt: skip
        fast = self._capacities(limits, _with_draft(fit, (0.0, 0.0)),
                                replace(spec, accept=fast_accept), fit.overhead_s)  # fmt: skip
        said = "acceptance 0 to 1" if accept is None else f"per-position acceptance {accept:.2f} as measured"
        why = f"draft {spec.draft} never booted on {engine}: {said}, drafting free to as dear as the target"
        return {t: Prediction(t, _middle(slow[t], fast[t]), slow[t], fast[t], why) for t in tiers}

    def predict_many(self, jobs: Sequence[Job], workers: int = 1) -> list[dict[str, Prediction]]:
        """``predict`` of every job, in order, over up to ``workers`` processes forked from this one
        (``tuner.search.model.parallel``): the predictions one process gives. Configs alike but for
        their memory fraction go to one worker together, so a simulation reused across KV pools
        (``_simulated``) is reused there as it is here."""
        groups = _alike(jobs)
        with Workers(self, min(workers, len(groups), len(jobs) // MIN_PER_WORKER)) as pool:
            by_group = pool.map(_predict_group, [[jobs[i] for i in g] for g in groups])
        if by_group is None:
            return [self.predict(engine, params, kv) for engine, params, kv in jobs]
        out: dict[int, dict[str, Prediction]] = {}
        for group, predictions in zip(groups, by_group, strict=True):
            out.update(zip(group, predictions, strict=True))
        return [out[i] for i in range(len(jobs))]

    def drive_rows(
        self, engine: str, params: Mapping[str, Any], kv_tokens: int | None, n: int, concurrency: int
    ) -> list[dict[str, Any]] | None:
        """A closed-loop drive predicted, as the objectives other than capacity measure a config: the
        study's first ``n`` requests sent by ``concurrency`` clients, each next one as one ends
        (``tuner.client.driver``), as the rows the drive records. None where the model has no costs
        to say it with: an engine never served, or a draft whose acceptance or costs it never measured
        on it (``predict`` gives those a range; a drive's latencies have no single figure to span).
        A client sends its next request when the simulated server ends one, a transfer
        (``overhead_s``) earlier than the client hears of it."""
        fit = self.fits.get(engine)
        if fit is None or not self.requests:
            return None
        measured = self._as_measured(engine, fit, speculation(params, 0.0))
        if measured is None:
            return None
        spec, theta = measured
        rows = [{"sent_s": 0.0, "prompt_tokens": s.prompt_tokens, "output_tokens": s.output_tokens,
                 "blocks": s.blocks, "error": None} for s in self.requests.first(n)]  # fmt: skip
        limits = limits_of(params, self.adapters[engine], self.device, kv_tokens)
        return self._served(rows, limits, theta, spec, fit.overhead_s, concurrency=concurrency)

    def _as_measured(
        self, engine: str, fit: Fit, spec: Speculation | None
    ) -> tuple[Speculation | None, np.ndarray] | None:
        """The config's speculation as ``engine``'s steps measured its draft (acceptance, share of
        proposing steps) and the costs to simulate it with; None where that draft's acceptance or
        drafting costs were never measured on ``engine``."""
        if spec is not None:
            accept = self.acceptance.get(engine, {}).get(spec.draft)
            if accept is None or fit.theta(spec) is None:
                return None
            spec = replace(spec, accept=accept, share=self.shares.get(engine, {}).get(spec.draft, 1.0))
        theta = fit.theta(spec)
        assert theta is not None
        return spec, theta

    def _served(
        self, rows: list[dict[str, Any]], limits: Limits, theta: np.ndarray, spec: Speculation | None,
        overhead_s: float, waiting: list[tuple[float, int]] | None = None, concurrency: int | None = None,
        demand: list[int] | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """``rows`` (in send order) served by the simulated scheduler, each given the times a real
        step records: when it was sent (its own release, or its client's turn in a closed loop), and
        its first and last token as the client hears them, ``overhead_s`` after the server."""
        works = step_works(rows, self.hit)
        lines = simulate(works, limits, theta, spec, waiting_trace=waiting, concurrency=concurrency, demand=demand)
        for row, line in zip(rows, lines, strict=True):
            row["sent_s"] = line.sent_s
            row["first_s"] = None if line.first_s is None else line.first_s + overhead_s
            row["done_s"] = None if line.done_s is None else line.done_s + overhead_s
        return rows

    def _capacities(
        self, limits: Limits, theta: np.ndarray, spec: Speculation | None, overhead_s: float
    ) -> dict[str, float]:
        key = (replace(limits, kv_tokens=None), theta.tobytes(), spec, overhead_s)
        pool = pool_blocks(limits.kv_tokens)
        for simulated_pool, asked, capacities in self._simulated.get(key, ()):
            if simulated_pool == pool or asked <= min(simulated_pool, pool):
                return dict(capacities)
        cache: dict[float, Measured] = {}
        demand: list[int] = []

        def step_at(rate: float) -> Measured:
            key = round(rate, 9)
            if key not in cache:
                cache[key] = self.serve_step(rate, limits, theta, spec, overhead_s, demand)
            return cache[key]

        out = {}
        for tier in self.plan.scored:
            slo = self.plan.tiers[tier]

            def passes(rate: float, slo: Mapping[str, float] = slo) -> bool:
                return judge_served(step_at(rate), slo, self.plan, rate).passed

            out[tier] = bisect_capacity(passes, self.plan.start_rate, self.plan.start_rate / FLOOR_DIVISOR)
        self._simulated.setdefault(key, []).append((pool, max(demand, default=0), dict(out)))
        return out

    def serve_step(
        self, rate: float, limits: Limits, theta: np.ndarray, spec: Speculation | None, overhead_s: float,
        demand: list[int] | None = None,
    ) -> Measured:  # fmt: skip
        """A simulated step at ``rate``, watched as a real one (``watch_offline``), held whole where
        ``hold``; ``demand`` gets the most KV blocks it asked for (``simulate``)."""
        waiting: list[tuple[float, int]] = []
        rows = self.step_rows(rate, limits, theta, spec, overhead_s, waiting, demand)
        return watch_offline(self.plan, rate, rows, waiting, hold=self.hold, tick_s=TICK_S)

    def step_rows(
        self, rate: float, limits: Limits, theta: np.ndarray, spec: Speculation | None, overhead_s: float,
        waiting: list[tuple[float, int]] | None = None, demand: list[int] | None = None,
    ) -> list[dict[str, Any]]:  # fmt: skip
        """A simulated step at ``rate``: the plan's requests for it, as request rows a real step records.
        Its requests are the study's first ones, the workload grown to them as a search grows it
        (``StudyRequests``). Where it cannot grow, a step longer than the known requests sends them
        again, in order, for their lengths; a real step's requests are distinct, and a prompt sent
        again would hit the simulated prefix cache whole, so such a step spreads the measured hit rate
        instead of their blocks.
        ``waiting`` gets the simulated server's waiting queue (``simulate``'s ``waiting_trace``)."""
        n = math.ceil(rate * self.plan.look_s(rate) * self.plan.step_limit)
        times = release_times(n, Arrival(rate=rate, burstiness=self.plan.burstiness), self.plan.seed)
        shapes = self.requests.first(n)
        known = len(shapes) == n
        rows = [{"sent_s": float(t or 0.0), "prompt_tokens": shape.prompt_tokens, "output_tokens": shape.output_tokens,
                 "blocks": shape.blocks if known else None, "error": None}
                for t, shape in zip(times, islice(cycle(shapes), n), strict=True)]  # fmt: skip
        return self._served(rows, limits, theta, spec, overhead_s, waiting, demand=demand)


def _alike(jobs: Sequence[Job]) -> list[list[int]]:
    """Job indices, those alike but for the memory fraction together, in first-seen order."""
    by_key: dict[str, list[int]] = {}
    for i, (engine, params, _) in enumerate(jobs):
        key = repr((engine, sorted((k, repr(v)) for k, v in params.items() if k != SAME_SIMULATION_BUT)))
        by_key.setdefault(key, []).append(i)
    return list(by_key.values())


def _predict_group(jobs: list[Job]) -> list[dict[str, Prediction]]:
    model = inherited()
    assert isinstance(model, EngineModel), "a worker forked without the model"
    return [model.predict(engine, params, kv) for engine, params, kv in jobs]


def _with_draft(fit: Fit, costs: tuple[float, float]) -> np.ndarray:
    return np.concatenate([np.array(fit.target), costs])


def _as_slow_as_target(fit: Fit) -> tuple[float, float]:
    """A draft's costs at their bound: a pass as dear as a target iteration, a token as a target's."""
    named = dict(zip(TARGET_FEATURES, fit.target, strict=True))
    return named["iteration"], named["token"]


def _middle(low: float, high: float) -> float:
    """The centre of a range on the log scale (capacities are positive and skewed)."""
    return math.sqrt(low * high) if low > 0 else high / 2


def bisect_capacity(passes: Callable[[float], bool], start: float, floor: float) -> float:
    """The highest rate that passes below the lowest one found failing, to ``PRECISION``: doubling
    from ``start`` while steps pass, halving while they fail (0 below ``floor``), then bisecting."""
    low, high, rate = 0.0, math.inf, start
    for _ in range(MAX_DOUBLINGS):
        if passes(rate):
            low = rate
            if high < math.inf:
                break
            rate *= 2
        else:
            high = rate
            if low > 0:
                break
            rate /= 2
            if rate < floor:
                return 0.0
    if high == math.inf or low == 0.0:
        return low
    while high / low > 1 + PRECISION:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if passes(mid) else (low, mid)
    return low


def model_sigma(record: Sequence[tuple[float, float]]) -> float:
    """The model's log error from (predicted, measured) capacities of this study's trials, each
    predicted before it booted; ``PRIOR_SIGMA`` until ``MIN_RECORD`` of them are known."""
    pairs = [(p, m) for p, m in record if p > 0 and m > 0]
    if len(pairs) < MIN_RECORD:
        return PRIOR_SIGMA
    return max(math.sqrt(sum(math.log(p / m) ** 2 for p, m in pairs) / len(pairs)), PRECISION)


def expected_improvement(prediction: Prediction, best: float, sigma: float) -> float:
    """E[max(C - best, 0)] for the capacity C: log-normal with the model's own error ``sigma`` around
    the prediction, and where a part was never measured, around any point of the range it allows
    (log-uniform over it: its ends are bounds, so a range wholly below ``best`` is worth little)."""
    c, low, high = prediction.capacity_req_s, prediction.low_req_s, prediction.high_req_s
    if c is None or high is None:
        return math.inf  # never served: nothing known, so worth a boot
    if high <= 0:
        return 0.0
    low = max(low or 0.0, high / 2**MAX_DOUBLINGS)
    points = [c] if high <= low else [low * (high / low) ** (i / (RANGE_POINTS - 1)) for i in range(RANGE_POINTS)]
    return sum(_lognormal_gain(max(p, low), best, sigma) for p in points) / len(points)


def _lognormal_gain(centre: float, best: float, sigma: float) -> float:
    m, s = math.log(centre), max(sigma, 1e-9)
    if best <= 0:
        return math.exp(m + s * s / 2)
    z = (m - math.log(best)) / s
    return math.exp(m + s * s / 2) * _phi(z + s) - best * _phi(z)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
