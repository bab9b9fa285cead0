"""Fit what an iteration costs from measured steps: the costs under which the simulated scheduler
gives each request the first and last token times it really had.

For a fixed schedule a request's token times are linear in the costs (``tuner.search.model.simulate``):
start of its busy period + (summed iteration features) . costs + the request's own overhead (HTTP,
tokenising; one constant). The schedule itself depends on the costs (a request arriving mid-iteration
waits for its end), so the fit is a fixed point: simulate every measured step under the current
costs, solve the linear least squares for new costs (non-negative: no work makes an iteration
faster), and repeat until the costs stop moving. Each equation is weighted by 1 / the geometric mean
of the measured latency and the one the current costs simulate, so the fit is on relative error (a
short TTFT counts as much as a long end-to-end time) and centred on the log scale. Either latency
alone biases it: dividing by the measured one gives a slow measurement less weight than a fast one,
which pulls every cost down; dividing by the simulated one gives a slow simulation less weight,
which pushes every cost up, by about the spread of the latencies' ratios (both seen, CHANGELOG.md;
the fit's figures: reports/search.md, "Where the model is wrong"). With both, an error of a factor c
up weighs as much as one of c down. This is iteratively reweighted least squares for
latencies whose spread grows with their size.

The fixed point alone is not the best fit. On a loaded server a schedule simulated with costs too
high holds more waiting and larger batches, and the least squares under that schedule asks for costs
nearly as high again: it leaves out how the schedule answers the costs. So each round's move is
tried further while a fresh simulation's residual keeps falling (a line search), and the fixed
point's answer is then polished by a pattern search on that residual itself (each cost moved by a
factor, one at a time). Both are judged on the residual the costs really give, schedule and all.

The target's costs are shared by every step of one engine; a draft model's two costs are fitted
only from steps that ran it, so a draft never booted has none (``Fit.theta`` says so).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.search.model.parallel import Workers, inherited
from tuner.search.model.simulate import DRAFT_FEATURES, TARGET_FEATURES, Limits, Speculation, Work, simulate

ITERATIONS = 20  # fixed-point rounds at most (each with its line search; then the polish)
STALLED = 2  # rounds in a row that leave the best residual within 1 % end the fixed point
RELAX = 1.5  # over-relaxation of each round's move (see fit_costs)
TOLERANCE = 1e-3  # relative change of the costs below which the fixed point has settled
MIN_LATENCY_S = 1e-3  # relative weights never divide by a latency below a millisecond
LONGEST_MOVE = 48.0  # a round's move tried at most this many times the least squares' own (see fit_costs)
POLISH_STEP = math.log(1.5)  # the polish's first move of a cost, as a factor
POLISH_FINEST = math.log(1.1)  # ...and its last
POLISH_EVALUATIONS = 16  # simulations of every step the polish may spend at most


@dataclass(frozen=True)
class ObservedStep:
    """One measured step as the fit reads it: the config's scheduler and speculation (with the
    acceptance its counters showed), each request's work as sent, and the first and last token times
    measured (s after the step's start; None where the request failed or never finished)."""

    limits: Limits
    spec: Speculation | None
    works: tuple[Work, ...]
    first_s: tuple[float | None, ...]
    done_s: tuple[float | None, ...]


@dataclass(frozen=True)
class Fit:
    """One engine's fitted costs: per iteration feature (``TARGET_FEATURES``), per draft model
    (``DRAFT_FEATURES``), and per request; with the relative RMS error of the latencies it fits."""

    target: tuple[float, ...]
    drafts: dict[str, tuple[float, float]] = field(default_factory=dict)
    overhead_s: float = 0.0
    residual: float = 0.0
    requests: int = 0
    steps: int = 0
    rounds: int = 0

    def theta(self, spec: Speculation | None) -> np.ndarray | None:
        """The cost vector for a config with ``spec``; None where its draft model was never run."""
        if spec is None:
            return np.array(self.target)
        if spec.draft not in self.drafts:
            return None
        return np.array(self.target + self.drafts[spec.draft])

    def as_dict(self) -> dict[str, object]:
        return {
            "target": dict(zip(TARGET_FEATURES, self.target, strict=True)),
            "drafts": {d: dict(zip(DRAFT_FEATURES, c, strict=True)) for d, c in self.drafts.items()},
            "overhead_s": self.overhead_s, "residual": self.residual, "requests": self.requests,
            "steps": self.steps, "rounds": self.rounds,
        }  # fmt: skip


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Non-negative least squares, min |a x - b| with x >= 0 (Lawson and Hanson's active set)."""
    n = a.shape[1]
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    a = a / scale  # columns of very different sizes (iterations, tokens) solve as one
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    tol = 1e-10 * max(1.0, float(np.abs(a).max()))
    for _ in range(3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        passive[int(np.argmax(np.where(passive, -np.inf, w)))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            bad = passive & (z <= tol)
            step = float(np.min(x[bad] / (x[bad] - z[bad])))
            x = x + step * (z - x)
            passive &= x > tol
    return np.asarray(x / scale, dtype=float)


def _columns(drafts: Sequence[str]) -> int:
    return len(TARGET_FEATURES) + len(DRAFT_FEATURES) * len(drafts) + 1


def _theta_for(costs: np.ndarray, drafts: Sequence[str], spec: Speculation | None) -> np.ndarray:
    target = costs[: len(TARGET_FEATURES)]
    if spec is None:
        return target
    at = len(TARGET_FEATURES) + len(DRAFT_FEATURES) * drafts.index(spec.draft)
    return np.concatenate([target, costs[at : at + len(DRAFT_FEATURES)]])


def _initial(steps: Sequence[ObservedStep], drafts: Sequence[str]) -> np.ndarray:
    """A start the fixed point moves from: half of a typical decode gap per iteration, half of a
    typical TTFT spread over its prompt per token (the rest is the first rounds' to find)."""
    gaps, per_token = [], []
    for step in steps:
        for work, first, done in zip(step.works, step.first_s, step.done_s, strict=True):
            if first is not None and done is not None and work.output_tokens > 1:
                gaps.append((done - first) / (work.output_tokens - 1))
                per_token.append((first - work.arrival_s) / max(work.prompt_tokens, 1))
    costs = np.zeros(_columns(drafts))
    costs[0] = 0.5 * statistics.median(gaps) if gaps else 0.01
    costs[1] = 0.5 * statistics.median(per_token) if per_token else 1e-4
    return costs


def _equations(
    steps: Sequence[ObservedStep], costs: np.ndarray, drafts: Sequence[str], pool: Workers | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every measured token time as one linear equation in the costs, under the schedule ``costs`` give
    (the steps simulated over ``pool``'s workers where it has them, in the same order)."""
    chunks = _chunks(len(steps), pool.n if pool is not None else 1)
    done = pool.map(_chunk_equations, [(chunk, costs) for chunk in chunks]) if pool is not None else None
    if done is None:
        done = [_step_equations([steps[i] for i in chunk], costs, drafts) for chunk in chunks]
    rows = [r for part in done for r in part[0]]
    ys = [y for part in done for y in part[1]]
    weights = [w for part in done for w in part[2]]
    return np.array(rows), np.array(ys), np.array(weights)


def _chunks(n: int, workers: int) -> list[range]:
    """``range(n)`` cut into a few contiguous runs per worker (one run where it is alone)."""
    parts = 1 if workers <= 1 else min(n, 4 * workers)
    edges = [round(i * n / parts) for i in range(parts + 1)]
    return [range(a, b) for a, b in zip(edges, edges[1:], strict=False) if b > a] or [range(0)]


def _chunk_equations(task: tuple[range, np.ndarray]) -> tuple[list[np.ndarray], list[float], list[float]]:
    """In a worker: ``_step_equations`` of the shared steps in ``task``'s run, at its costs."""
    steps, drafts = inherited()
    chunk, costs = task
    return _step_equations([steps[i] for i in chunk], costs, drafts)


def _step_equations(
    steps: Sequence[ObservedStep], costs: np.ndarray, drafts: Sequence[str]
) -> tuple[list[np.ndarray], list[float], list[float]]:
    rows: list[np.ndarray] = []
    ys: list[float] = []
    weights: list[float] = []
    n_target = len(TARGET_FEATURES)
    for step in steps:
        timelines = simulate(step.works, step.limits, _theta_for(costs, drafts, step.spec), step.spec)
        at = None
        if step.spec is not None:
            at = n_target + len(DRAFT_FEATURES) * drafts.index(step.spec.draft)
        for work, line, first, done in zip(step.works, timelines, step.first_s, step.done_s, strict=True):
            for measured, simulated, start, features in (
                (first, line.first_s, line.first_start_s, line.first_features),
                (done, line.done_s, line.done_start_s, line.done_features),
            ):
                if measured is None or simulated is None or features is None:
                    continue
                row = np.zeros(len(costs))
                row[:n_target] = features[:n_target]
                if at is not None:
                    row[at : at + len(DRAFT_FEATURES)] = features[n_target:]
                row[-1] = 1.0  # the request's own overhead
                rows.append(row)
                ys.append(measured - start)
                # both latencies, not either alone (see the module's docstring)
                model_s = max(simulated + costs[-1] - work.arrival_s, MIN_LATENCY_S)
                weights.append(1.0 / math.sqrt(model_s * max(measured - work.arrival_s, MIN_LATENCY_S)))
    return rows, ys, weights


def _residual(a: np.ndarray, y: np.ndarray, w: np.ndarray, costs: np.ndarray) -> float:
    """RMS error of the token times the costs give, under the schedule they give, relative to the
    geometric mean of those and the measured ones."""
    return math.sqrt(float(np.mean(((a @ costs - y) * w) ** 2))) if len(y) else math.inf


Equations = tuple[np.ndarray, np.ndarray, np.ndarray]


def _simulated(
    steps: Sequence[ObservedStep], costs: np.ndarray, drafts: Sequence[str], pool: Workers | None
) -> tuple[float, Equations]:
    """The residual ``costs`` really give (every step simulated afresh under them), and the equations
    of that schedule, which the next least squares solves."""
    equations = _equations(steps, costs, drafts, pool)
    return _residual(*equations, costs), equations


def _start(steps: Sequence[ObservedStep], drafts: Sequence[str], start: Fit | None) -> np.ndarray:
    """Where the fixed point starts: an earlier fit's costs (a study refits after every trial), else ``_initial``."""
    costs = _initial(steps, drafts)
    if start is None:
        return costs
    costs[: len(TARGET_FEATURES)] = start.target
    for i, draft in enumerate(drafts):
        if draft in start.drafts:
            at = len(TARGET_FEATURES) + len(DRAFT_FEATURES) * i
            costs[at : at + len(DRAFT_FEATURES)] = start.drafts[draft]
    costs[-1] = start.overhead_s
    return costs


def fit_costs(
    steps: Sequence[ObservedStep], rounds: int = ITERATIONS, start: Fit | None = None, workers: int = 1
) -> Fit | None:
    """The costs that best explain ``steps`` (one engine's), or None without a measured request; each
    round's simulations over up to ``workers`` processes (the same fit, sooner).

    Each round solves the least squares under the schedule the current costs give, and moves the
    costs ``RELAX`` times the way it points, then twice as far, and so on while a fresh simulation's
    residual keeps falling (``LONGEST_MOVE`` at most): the plain fixed point creeps down a long
    slope (the module's docstring). The round whose costs simulate the measured times best is kept,
    since near the answer a schedule flips back and forth; the rounds end when they converge, or
    after ``STALLED`` rounds in a row that hardly improve on it. Then ``_polish``."""
    drafts = sorted({s.spec.draft for s in steps if s.spec is not None})
    costs = _start(steps, drafts, start)
    with Workers((steps, drafts), min(workers, len(steps))) as pool:
        residual, (a, y, w) = _simulated(steps, costs, drafts, pool)
        if len(y) == 0:
            return None
        best, done, stalled = (residual, costs, 0), 0, 0
        for done in range(1, rounds + 1):
            new = nnls(a * w[:, None], y * w)
            if np.abs(new - costs).max() <= TOLERANCE * max(float(np.abs(new).max()), 1e-12):
                break
            moved: tuple[float, np.ndarray, Equations] | None = None
            scale = RELAX
            while scale <= LONGEST_MOVE:
                trial = np.maximum(costs + scale * (new - costs), 0.0)
                found, equations = _simulated(steps, trial, drafts, pool)
                if moved is not None and found >= moved[0]:
                    break
                moved, scale = (found, trial, equations), scale * 2
            assert moved is not None
            residual, costs, (a, y, w) = moved
            if len(y) == 0:
                break
            if residual < best[0]:
                stalled = stalled + 1 if residual > 0.99 * best[0] else 0
                best = (residual, costs, done)
            else:
                stalled += 1
            if stalled >= STALLED:
                break
        residual, costs, done = best
        residual, costs = _polish(steps, drafts, costs, residual, pool)
    n_target, n_draft = len(TARGET_FEATURES), len(DRAFT_FEATURES)
    by_draft = {d: costs[n_target + n_draft * i : n_target + n_draft * (i + 1)] for i, d in enumerate(drafts)}
    return Fit(
        tuple(float(c) for c in costs[:n_target]), {d: (float(c[0]), float(c[1])) for d, c in by_draft.items()},
        float(costs[-1]), residual, sum(len(s.works) for s in steps), len(steps), done,
    )  # fmt: skip


def _polish(
    steps: Sequence[ObservedStep], drafts: Sequence[str], costs: np.ndarray, residual: float, pool: Workers | None
) -> tuple[float, np.ndarray]:
    """Pattern search from the fixed point on the log of each positive cost, judged by the residual
    of a fresh simulation of every step (the schedule moves with the costs): each cost in turn is
    tried ``POLISH_STEP`` up and down, a move kept where it lowers the residual, the step halved
    once a sweep keeps none, down to ``POLISH_FINEST`` or ``POLISH_EVALUATIONS`` simulations. A cost
    the least squares left at zero stays there (a factor cannot move it)."""
    active = [int(i) for i in np.flatnonzero(costs > 0)]
    step, spent = POLISH_STEP, 0
    while step >= POLISH_FINEST and spent < POLISH_EVALUATIONS:
        moved = False
        for i in active:
            for sign in (-1.0, 1.0):
                if spent >= POLISH_EVALUATIONS:
                    break
                trial = costs.copy()
                trial[i] *= math.exp(sign * step)
                found = _simulated(steps, trial, drafts, pool)[0]
                spent += 1
                if found < residual:
                    residual, costs, moved = found, trial, True
                    break
        if not moved:
            step /= 2
    return residual, costs
