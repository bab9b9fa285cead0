"""The Optuna objective of ``tuner search``: sample a config, screen it, run it, record it.

Per trial, in order:

1. sample a config from the space (the enqueued engine default samples only its engine; a config
   the space enqueues, ``tuner.search.enqueue``, reads back its fixed params and is screened as a
   sampled one);
2. a config the engine refuses (``EngineAdapter.refusal``: its validation, or a known death at
   boot), or one no easier than a config it refused before (``tuner.search.rejections``), is
   recorded as ``invalid_config`` without a boot; one whose draft an earlier trial on the engine
   measured accepting next to nothing (``tuner.search.acceptance``) is told pruned without a boot;
   then the memory screen (``tuner.search.memory``) estimates its KV cache from the model's shape,
   calibrated on every earlier trial of the study; a config it finds cannot fit is recorded as
   ``screened`` (infeasible, with the estimate) and its engine never boots. The engine default is
   never screened;
3. otherwise the trial runs (``runner``: ``tuner.measure.trial.run_trial``, or a table in the benchmark),
   with a pruner watching its workload (``tuner.search.pruning``) against the feasible trials so far;
4. the result is stored on the trial (``record``); a pruned trial ends PRUNED.

Every trial's memory estimate and the engine's own memory lines are stored, so each trial, booted
or not, calibrates the next ones, and the screen's hits and misses can be counted afterwards.

"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, cast

import optuna

from tuner.engines.base import Config
from tuner.engines.speculation import OFF, describe, draft_of, method_of
from tuner.errors import ConfigError
from tuner.measure.process import head
from tuner.measure.statistics import trial_intervals
from tuner.measure.trial import TrialContext, TrialResult, WatchFactory, run_trial
from tuner.search.acceptance import MEASURED_STATES
from tuner.search.grid import grid_points
from tuner.search.learned import Learned, learned_screen
from tuner.search.memory import estimate, observations, parse_facts
from tuner.search.pruning import FrontWatch, checkpoints
from tuner.search.rejections import REJECTED
from tuner.search.scoring import values, violation
from tuner.search.space import Space, suggest
from tuner.search.speculation import Offer, engines_at, study_offers
from tuner.study.attrs import (
    CONSTRAINT,
    SAMPLED_KIND,
    SCREENED,
    TrialAttrs,
    checked_trial_attrs,
    is_default,
    trial_attrs,
    write_trial_attrs,
)
from tuner.study.cost import tok_s_per_gpu
from tuner.study.feasible import feasible_trials

Runner = Callable[..., TrialResult]  # (number, config, ctx, watch=...) -> TrialResult


@dataclass(frozen=True)
class Prepared:
    """A sampled config and the screen's verdict on it, before anything boots."""

    config: Config
    estimate: dict[str, Any] | None
    is_default: bool
    told: bool = False  # recorded without a boot (screened, or a config already measured): tell it as is
    values: list[float] = field(default_factory=list)  # what to tell, when ``told``
    state: optuna.trial.TrialState = optuna.trial.TrialState.COMPLETE
    why: str = ""  # why a trial told PRUNED was not booted


@dataclass
class SearchObjective:
    """The callable Optuna runs per trial: sample a config from the space (screened for memory and
    learned refusals first), boot and measure it (``tuner.measure.trial``), record it on the trial,
    and return its objective values."""

    study: optuna.Study
    space: Space
    ctx: TrialContext
    objective: str  # a name in tuner.study.objectives.REGISTRY; callers pass theirs
    screen: bool = True
    prune: bool = True
    runner: Runner | None = None  # None: tuner.measure.trial.run_trial
    free_memory: Callable[[], int | None] = field(default=lambda: None)  # the GPU's free bytes now
    boots: int = 0  # trials of this run that booted an engine (screened ones do not)
    offers: Mapping[str, Offer] | None = None  # what each engine may speculate with (None: worked out here)

    def __post_init__(self) -> None:
        if self.offers is None:
            p = self.space.parameters
            self.offers = study_offers(p.methods(), p.named_drafts(), engines_at(self.ctx.engines), self.ctx.model)[0]

    @property
    def engine_offers(self) -> Mapping[str, Offer]:
        assert self.offers is not None  # set by __post_init__
        return self.offers

    def __call__(self, trial: optuna.Trial) -> list[float]:
        prepared = self.prepare(trial)
        if prepared.told and prepared.state == optuna.trial.TrialState.PRUNED:
            raise optuna.TrialPruned(prepared.why)
        return prepared.values if prepared.told else self.execute(trial, prepared)

    def prepare(self, trial: optuna.Trial) -> Prepared:
        """Sample and screen (fast: parallel workers do this one at a time, under a lock). A screened
        trial, or one whose config was already measured, is recorded here and carries what to tell."""
        default = is_default(trial)
        if trial_attrs(trial).get("config_kind") is None:  # an enqueued config or a grid point has its kind
            write_trial_attrs(trial, TrialAttrs(config_kind=SAMPLED_KIND))
        ctx = self.ctx
        config = suggest(trial, self.space, self.engine_offers, default)
        ran = self.study.get_trials(deepcopy=False, states=MEASURED_STATES)  # one read of the storage
        finished = [t for t in ran if t.state == optuna.trial.TrialState.COMPLETE]
        adapter, env = ctx.engines[config.engine]
        est = estimate(
            config, ctx.model, ctx.device, observations([t.user_attrs for t in finished]),
            adapter.default_memory_fraction, adapter.kv_tokens_required(ctx.model), self.free_memory(),
        )  # fmt: skip
        estimate_attrs = None if est is None else est.as_dict()
        twin = None if default else self._measured_twin(config)
        if twin is not None:
            return self._duplicate(trial, config, twin, estimate_attrs)
        refused = (
            None
            if default or not self.screen
            else adapter.refusal(config.params, ctx.device, env.version, config.enforce_eager)
        )
        if refused is not None:
            why = f"the engine refuses it: {refused}"
            return self._not_booted(trial, config, REJECTED, "known", why, estimate_attrs, refused=refused)
        learned = learned_screen(config, ran, adapter) if self.screen and not default else None
        if learned is not None and learned.rejected:
            return self._not_booted(
                trial, config, REJECTED, "known", learned.why, estimate_attrs, rejected_like=learned.like.number
            )
        if learned is not None:
            return self._idle_draft(trial, config, learned, estimate_attrs)
        if not (self.screen and not default and est is not None and not est.fits):
            return Prepared(config, estimate_attrs, default)
        why = (f"KV cache for {est.predicted_tokens} tokens predicted, {est.required_tokens} needed "
               f"({est.basis})")  # fmt: skip
        return self._not_booted(trial, config, SCREENED, SCREENED, why, estimate_attrs)

    def _measured_twin(self, config: Config) -> optuna.trial.FrozenTrial | None:
        """An earlier search trial that booted this very config (a sampler proposes one again when it
        is confident; booting it again would buy a second measurement at the price of a trial)."""
        states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
        for t in self.study.get_trials(deepcopy=False, states=states):
            a = t.user_attrs
            if a.get("booted") and a.get("engine") == config.engine and a.get("config") == dict(config.params):
                return t
        return None

    def _explore_next(self, number: int) -> None:
        """A sampler that repeats itself has stopped learning there: the next trial takes a config not
        measured yet (seeded by the trial number), so the search goes on instead of standing still."""
        if self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
            return  # something is queued already
        try:
            points = grid_points(self.space, self.engine_offers)
        except ConfigError:
            return  # a continuous space: a sampler hardly repeats a point there
        seen = [t.params for t in self.study.get_trials(deepcopy=False)]
        fresh = [p for p in points if p not in seen]
        if fresh:
            kind = checked_trial_attrs(TrialAttrs(config_kind=SAMPLED_KIND))
            self.study.enqueue_trial(random.Random(number).choice(fresh), user_attrs=kind)

    def _duplicate(
        self, trial: optuna.Trial, config: Config, twin: optuna.trial.FrozenTrial, est: dict[str, Any] | None
    ) -> Prepared:
        """Tell the twin's outcome again, without a boot: the sampler learns the same as from the twin.
        Its times are the twin's alone, so a sum over the study counts that boot once."""
        # what is the twin's own: its kind, worker, times, and the prediction made before it booted
        own = ("config_kind", "worker", "boot_s", "phases_s", "predicted")
        copied = {k: v for k, v in twin.user_attrs.items() if k not in own}
        if isinstance(copied.get("capacity"), dict):  # the curve is the twin's; the seconds it took were spent once
            copied["capacity"] = {**copied["capacity"], "search_s": None}
        write_trial_attrs(trial, cast(TrialAttrs, copied))
        write_trial_attrs(trial, TrialAttrs(booted=False, duplicate_of=twin.number))
        self.ctx.progress.phase(trial.number, "known", f"same config as trial {twin.number}: not booted again")
        self._explore_next(trial.number)
        if twin.state == optuna.trial.TrialState.PRUNED:
            why = "the same config was pruned before"
            return Prepared(config, est, False, told=True, state=optuna.trial.TrialState.PRUNED, why=why)
        trial.set_constraint(CONSTRAINT, float(twin.constraints.get(CONSTRAINT, 1.0)))
        return Prepared(config, est, False, told=True, values=list(twin.values or []))

    def execute(self, trial: optuna.Trial, prepared: Prepared, ctx: TrialContext | None = None) -> list[float]:
        """Boot, drive and record a prepared trial (``ctx``: a GPU slot's own context); a pruned
        trial raises ``optuna.TrialPruned`` once recorded."""
        self.boots += 1
        write_trial_attrs(trial, TrialAttrs(booted=True))
        capacity = (ctx or self.ctx).capacity is not None
        watch = None if prepared.is_default or not self.prune or capacity else self._watch()
        extra: dict[str, Any] = {}
        if capacity:  # start near the best so far; the engine default is measured whole, never pruned
            extra = {"incumbents": self._incumbents(), "prune": self.prune and not prepared.is_default}
        result = self._run(trial.number, prepared.config, watch, ctx or self.ctx, **extra)
        result.memory_estimate = prepared.estimate
        if not result.memory_facts and result.log_path and Path(result.log_path).exists():
            result.memory_facts = parse_facts(head(Path(result.log_path)))
        values = record(trial, result, self.objective, self.ctx.slo)
        if result.pruned is not None:
            raise optuna.TrialPruned(f"pruned after {result.pruned['at_requests']} requests")
        return values

    def _run(
        self, number: int, config: Config, watch: WatchFactory | None, ctx: TrialContext, **extra: Any
    ) -> TrialResult:
        if self.runner is None:
            return run_trial(number, config, ctx, watch=watch, **extra)
        return self.runner(number, config, ctx, watch=watch, **extra)

    def _incumbents(self) -> dict[str, float]:
        """Each scored tier's best capacity among the feasible trials so far."""
        best: dict[str, float] = {}
        plan = self.ctx.capacity
        if plan is None:
            return best
        for t in feasible_trials(self.study):
            for tier in plan.scored:
                value = (trial_attrs(t).get("metrics") or {}).get(f"capacity_{tier}_req_s")
                if isinstance(value, int | float) and value > best.get(tier, 0.0):
                    best[tier] = float(value)
        return best

    def _watch(self) -> WatchFactory:
        references = {t.number: trial_attrs(t)["checkpoints"] for t in feasible_trials(self.study)
                      if trial_attrs(t).get("checkpoints")}  # fmt: skip

        def factory(n_total: int, boot_s: float) -> FrontWatch:
            return FrontWatch(n_total, references, self.objective, self.ctx.slo, time.perf_counter(), boot_s)

        return factory

    def _not_booted(
        self, trial: optuna.Trial, config: Config, failure: str, phase: str, why: str,
        est: dict[str, Any] | None, rejected_like: int | None = None, refused: str | None = None,
    ) -> Prepared:  # fmt: skip
        """Record, with ``failure`` and no boot, a config screened out, refused by the engine's own
        validation (``refused``: why, ``EngineAdapter.refusal``) or rejected like an earlier one."""
        result = self._unbooted(trial, config, phase, why)
        result.failure, result.memory_estimate = failure, est
        values = record(trial, result, self.objective, self.ctx.slo)
        write_trial_attrs(trial, TrialAttrs(booted=False))
        if rejected_like is not None:
            write_trial_attrs(trial, TrialAttrs(rejected_like=rejected_like))
        if refused is not None:
            write_trial_attrs(trial, TrialAttrs(refused=refused))
        return Prepared(config, est, False, told=True, values=values)

    def _idle_draft(
        self, trial: optuna.Trial, config: Config, learned: Learned, est: dict[str, Any] | None
    ) -> Prepared:
        """Tell, as pruned and without a boot, a config whose draft an earlier trial measured accepting
        next to nothing (``tuner.search.acceptance``): the sampler learns it as a trial that fell short."""
        why = learned.why
        result = self._unbooted(trial, config, "known", why)
        attrs = TrialAttrs(
            booted=False, idle_draft_like=learned.like.number, engine=config.engine, config=dict(config.params)
        )
        attrs.update(
            TrialAttrs(launch=result.launch.stored(), engine_version=result.engine_version, memory_estimate=est)
        )
        write_trial_attrs(trial, attrs)
        return Prepared(config, est, False, told=True, state=optuna.trial.TrialState.PRUNED, why=why)

    def _unbooted(self, trial: optuna.Trial, config: Config, phase: str, why: str) -> TrialResult:
        """Say why ``config`` is not booted; its result so far: the launch it would have had, no outcome."""
        adapter, env = self.ctx.engines[config.engine]
        launch = adapter.launch(config, self.ctx.model, self.ctx.device, 0, env.python, env.version)
        self.ctx.progress.phase(trial.number, phase, f"{config.engine} {_describe(config)}: {why}; not booted")
        return TrialResult(config=config, launch=launch, engine_version=env.version)


def _describe(config: Config) -> str:
    return " ".join(f"{k}={v}" for k, v in config.params.items())


# TrialResult's fields that ``record`` stores in another form (the launch as stored, the config as its engine
# and parameters, the capacity search flattened by tier), and the one it leaves to the finalists: the stress
# run's raw outcome, whose reading they store. Every other field is stored as it is.
RECORDED_DERIVED = frozenset({"launch", "config", "capacity"})
NOT_RECORDED = frozenset({"stress"})
RECORDED_AS_IS = tuple(f.name for f in fields(TrialResult) if f.name not in RECORDED_DERIVED | NOT_RECORDED)


def record(
    trial: optuna.Trial, result: TrialResult, objective: str, slo: Mapping[str, float] | None = None
) -> list[float]:
    """Store the trial's user attributes and return its objective values."""
    attrs = cast(TrialAttrs, {name: getattr(result, name) for name in RECORDED_AS_IS})
    attrs.update(
        TrialAttrs(
            ttft_p95_ms=_finite(result.ttft_p95_ms),
            output_throughput_tok_s=result.output_throughput_tok_s,
            constraint_violation=violation(result, objective, slo),
            launch=result.launch.stored(),  # python, module, args, host, port, env: what exports read
            engine=result.config.engine,
            config=dict(result.config.params),
            metrics={k: _finite(v) for k, v in result.metrics.items()},
            log_tail=result.log_tail[-10000:],
            checkpoints=checkpoints(result.request_log, slo or {}) if result.failure is None else {},
            ci=trial_intervals(result.request_log, result.metrics) if result.failure is None else {},
            speculation=speculation_attrs(result),
            **capacity_attrs(result),
        )
    )
    write_trial_attrs(trial, attrs)
    trial.set_constraint(CONSTRAINT, attrs["constraint_violation"])
    return values(objective, result.metrics, failed=result.failure is not None)


def _finite(value: float) -> float | None:
    """JSON (and so the RDB storage) has no NaN or inf: store None instead."""
    return value if math.isfinite(value) else None


def speculation_attrs(result: TrialResult) -> dict[str, Any] | None:
    """A speculating trial's method, draft or head, K and what the engine's counters say of them:
    the acceptance rate and mean accepted length of the trial (at the objective tier's capacity, in a
    capacity search) and of every step it served, in the order served (None: the trial did not
    speculate). The steps are the served ones (``capacity["measured"]``), not the tiers' judged ones:
    a rate served twice (a look's early pass, then its confirmation served whole) is two steps with
    their own counters, and a step both tiers judged is one."""
    params = result.config.params
    method = method_of(params)
    if method == OFF:
        return None
    server = result.server or {}
    steps = [_acceptance_at(served) for served in (result.capacity or {}).get("measured") or []]
    return {
        "method": method, "label": describe(params), "draft": draft_of(params),
        "num_speculative_tokens": int(params["num_speculative_tokens"]),
        "acceptance_rate": server.get("spec_acceptance_rate"), "mean_accept_len": server.get("spec_mean_accept_len"),
        "steps": steps,
    }  # fmt: skip


def _acceptance_at(served: dict[str, Any]) -> dict[str, Any]:
    """One served step's rate and the acceptance its counters moved by."""
    stats = served.get("server") or {}
    return {"rate_req_s": served["rate_req_s"], "acceptance_rate": stats.get("spec_acceptance_rate"),
            "mean_accept_len": stats.get("spec_mean_accept_len")}  # fmt: skip


def capacity_attrs(result: TrialResult) -> TrialAttrs:
    """A capacity trial's figures as flat attributes (``tuner trials`` and the dashboard show them) and
    its whole search (every tier's curve) as ``capacity``; nothing for the older objectives."""
    if result.capacity is None:
        return {}
    tiers = result.capacity["tiers"]
    first = result.capacity["objective_tier"]
    attrs = TrialAttrs(
        capacity=result.capacity,
        capacity_req_s=tiers[first]["capacity_req_s"],
        slo={"tier": first, **tiers[first]["slo"], "attainment": tiers[first]["target"]},
        # what the capacity is worth: output tokens/s one GPU sustains at it (tuner.study.cost)
        output_tok_s_per_gpu=tok_s_per_gpu({"capacity": result.capacity, "launch": result.launch.stored()}, first),
    )
    # each tier's capacity, keyed by its name: checked against TrialAttrs when written
    per_tier = {f"capacity_{tier}_req_s": searched["capacity_req_s"] for tier, searched in tiers.items()}
    return cast(TrialAttrs, {**attrs, **per_tier})
