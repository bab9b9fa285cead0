"""What the performance model learns from: the measured steps of a study's served trials.

A capacity trial stores every step it served (``tuner.measure.rate_steps.Measured.compact``): the
rate, the server's counters over the step (prefix-cache hit rate, speculative acceptance) and each
request's send, first-token and last-token times with its prompt and output tokens. Here they
become ``ObservedStep``s for the fit: the config's scheduler limits (the engine adapter's
``scheduler_limits``, the KV pool its log reported), its speculation at the acceptance the step
showed, and each request's prompt less the share its prefix-cache hits spared.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna

from tuner.engines.base import Device, EngineAdapter
from tuner.engines.speculation import proposer_of
from tuner.measure.rate_steps import ROW_FIELDS, Measured
from tuner.search.model.fit import ObservedStep
from tuner.search.model.requests import StudyRequests
from tuner.search.model.simulate import Limits, Speculation, Work, acceptance_of
from tuner.study.attrs import STRESS_CHECK_KIND, trial_attrs

MAX_STEPS_PER_TRIAL = 8  # a trial's steps the fit reads, spread over its rates: a fit stays seconds long


@dataclass(frozen=True)
class Served:
    """A trial the model learns from: its engine and parameters, its KV pool in tokens (the engine's
    own log line; None where unknown) and the steps it served."""

    engine: str
    params: Mapping[str, Any]
    kv_tokens: int | None
    steps: tuple[Measured, ...]


def measured_of(stored: Mapping[str, Any]) -> Measured:
    """A stored step (``Measured.compact``) back as a ``Measured``."""
    rows = [dict(zip(ROW_FIELDS, row, strict=False)) for row in stored.get("rows") or []]  # older: no id
    return Measured(float(stored["rate_req_s"]), rows, [], float(stored.get("duration_s") or 0.0),
                    dict(stored.get("server") or {}), aborted=bool(stored.get("aborted")))  # fmt: skip


def served_of(trial: optuna.trial.FrozenTrial, blocks: Mapping[str, tuple[int, ...]] | StudyRequests) -> Served | None:
    """A study's trial as the model reads it, each request's prompt blocks looked up by its id in
    ``blocks`` (the study's requests, grown to those its steps sent); None when it served no step
    (screened, failed to boot, a twin of another, or recorded by a tuner that did not store its steps)."""
    a = trial_attrs(trial)
    if a.get("booted") is False or a.get("duplicate_of") is not None or a.get("config_kind") == STRESS_CHECK_KIND:
        return None
    stored = [measured_of(s) for s in (a.get("capacity") or {}).get("measured") or [] if isinstance(s, dict)]
    if isinstance(blocks, StudyRequests):
        blocks = blocks.cover(_request_id(r) for m in stored for r in m.rows)
    steps = tuple(_with_blocks(m, blocks) for m in stored)
    if not steps or "engine" not in a:
        return None
    kv = (a.get("memory_facts") or {}).get("kv_tokens")
    return Served(a["engine"], dict(a.get("config") or {}), None if kv is None else int(kv), steps)


def _with_blocks(step: Measured, blocks: Mapping[str, tuple[int, ...]]) -> Measured:
    """The step with each row's prompt blocks, where its request is one the model knows (a trace's
    replay is the same request under a ``~lap`` suffix)."""
    rows = [{**r, "blocks": blocks.get(_request_id(r))} for r in step.rows]
    return replace(step, rows=rows)


def _request_id(row: Mapping[str, Any]) -> str:
    """The request a row sent (a trace's replay is the same request under a ``~lap`` suffix)."""
    return str(row.get("request_id") or "").split("~")[0]


def speculation(params: Mapping[str, Any], accept: float, share: float = 1.0) -> Speculation | None:
    """The config's speculation at per-position acceptance ``accept`` in the ``share`` of decode steps
    that propose (None: it does not speculate)."""
    k = int(params.get("num_speculative_tokens") or 0)
    if k <= 0:
        return None
    draft = proposer_of(params) or ""
    schedule = tuple((int(a), int(b), int(c)) for a, b, c in params.get("spec_schedule") or ())
    return Speculation(draft, k, accept, schedule, share)


def limits_of(params: Mapping[str, Any], adapter: EngineAdapter, device: Device, kv_tokens: int | None) -> Limits:
    scheduler = adapter.scheduler_limits(params, device)
    return Limits(scheduler.token_budget, scheduler.max_seqs, kv_tokens, scheduler.prefill_first)


def hit_rate(step: Measured) -> float:
    value = step.server.get("prefix_cache_hit_rate")
    return float(value) if isinstance(value, int | float) and 0.0 <= value <= 1.0 else 0.0


def step_share(step: Measured) -> float | None:
    """The share of the step's decode steps that proposed, where the engine's counters say
    (``spec_draft_share``; a model-free lookup proposes only where it finds a match)."""
    value = step.server.get("spec_draft_share")
    return float(value) if isinstance(value, int | float) and 0.0 <= value <= 1.0 else None


def step_acceptance(step: Measured, k: int) -> float | None:
    """The per-position acceptance the step's counters show at ``k`` speculative tokens."""
    value = step.server.get("spec_acceptance_rate")
    return acceptance_of(float(value), k) if isinstance(value, int | float) and k > 0 else None


def computed_prompts(prompts: Sequence[int], hit: float) -> list[int]:
    """The prompt tokens each request of a step computes (in send order) when the step's prefix-cache
    hit rate is ``hit``: the first one computes all of its prompt (the cache is emptied before every
    step), the others share the hits evenly. Which request shares which prefix the counters do not
    say; this keeps their total and the first request's cold start."""
    if not prompts:
        return []
    total, rest = sum(prompts), sum(prompts) - prompts[0]
    share = min(hit * total / rest, 1.0) if rest > 0 else 0.0
    return [max(1, prompts[0])] + [max(1, round(p * (1.0 - share))) for p in prompts[1:]]


def step_works(rows: Sequence[Mapping[str, Any]], hit: float) -> list[Work]:
    """A step's requests (rows in send order, each with ``sent_s``, ``prompt_tokens``, ``output_tokens``
    and, where the prefix structure is known, ``blocks``) as the simulator's work: with every row's
    blocks the prefix cache is simulated, else the step's hit rate is spread (``computed_prompts``)."""
    if rows and all(r.get("blocks") is not None for r in rows):
        return [Work(float(r["sent_s"]), int(r["prompt_tokens"] or 1), max(int(r["output_tokens"] or 0), 1),
                     tuple(r["blocks"])) for r in rows]  # fmt: skip
    computed = computed_prompts([int(r["prompt_tokens"] or 1) for r in rows], hit)
    return [
        Work(float(r["sent_s"]), c, max(int(r["output_tokens"] or 0), 1)) for r, c in zip(rows, computed, strict=True)
    ]


def observed(
    served: Served, adapter: EngineAdapter, device: Device, accept: float, share: float = 1.0
) -> list[ObservedStep]:
    """The fit's view of a trial's steps (those the monitor did not cut), at most ``MAX_STEPS_PER_TRIAL``
    spread over its rates; ``accept`` and ``share`` where a step's counters say nothing of them."""
    limits = limits_of(served.params, adapter, device, served.kv_tokens)
    usable = sorted((s for s in served.steps if not s.aborted and s.rows), key=lambda s: s.rate_req_s)
    if len(usable) > MAX_STEPS_PER_TRIAL:
        pick = [round(i * (len(usable) - 1) / (MAX_STEPS_PER_TRIAL - 1)) for i in range(MAX_STEPS_PER_TRIAL)]
        usable = [usable[i] for i in dict.fromkeys(pick)]
    out = []
    k = int(served.params.get("num_speculative_tokens") or 0)
    for step in usable:
        measured = step_acceptance(step, k)
        proposing = step_share(step)
        spec = speculation(served.params, accept if measured is None else measured,
                           share if proposing is None else proposing)  # fmt: skip
        out.append(_observed_step(step, limits, spec))
    return out


def _observed_step(step: Measured, limits: Limits, spec: Speculation | None) -> ObservedStep:
    rows = sorted(step.rows, key=lambda r: float(r["sent_s"]))
    finished = [int(r["output_tokens"] or 0) for r in rows if r.get("done_s") is not None and r.get("error") is None]
    typical = round(statistics.median(finished)) if finished else 1
    works, firsts, dones = [], [], []
    for r, work in zip(rows, step_works(rows, hit_rate(step)), strict=True):
        ok = r.get("error") is None and r.get("done_s") is not None and r.get("first_s") is not None
        output = int(r["output_tokens"] or 0) if ok else typical  # a request cut short: as long as the rest
        works.append(replace(work, output_tokens=max(output, 1)))
        firsts.append(float(r["first_s"]) if ok else None)
        dones.append(float(r["done_s"]) if ok else None)
    return ObservedStep(limits, spec, tuple(works), tuple(firsts), tuple(dones))


def draft_share(served: Sequence[Served], engine: str) -> dict[str, float]:
    """Per draft, the share of decode steps that proposed (the median over the steps whose counters
    say): like its acceptance, a fact of target, draft and workload on this engine."""
    return _per_proposer(served, engine, lambda step, _k: step_share(step))


def draft_acceptance(served: Sequence[Served], engine: str) -> dict[str, float]:
    """Per draft, the per-position acceptance its steps showed (the median over them): a fact of
    target, draft and workload, which carries over to every K and every chunk size."""
    return _per_proposer(served, engine, step_acceptance)


def _per_proposer(
    served: Sequence[Served], engine: str, read: Callable[[Measured, int], float | None]
) -> dict[str, float]:
    """Per proposer of ``engine``'s speculating trials, the median of what ``read`` finds in each
    step (given the step and its K), over the steps where it finds something."""
    seen: dict[str, list[float]] = {}
    for s in served:
        k = int(s.params.get("num_speculative_tokens") or 0)
        if s.engine != engine or k <= 0:
            continue
        for step in s.steps:
            if (value := read(step, k)) is not None:
                seen.setdefault(proposer_of(s.params) or "", []).append(value)
    return {draft: statistics.median(values) for draft, values in seen.items()}
