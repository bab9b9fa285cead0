"""The Optuna objective of ``tuner search``: sample a config, screen it, run it, record it.

Per trial, in order:

1. sample a config from the space (the enqueued engine default samples only its engine);
2. the memory screen (``tuner.memory``) estimates its KV cache from the model's shape, calibrated on
   every earlier trial of the study; a config it finds cannot fit is recorded as ``screened``
   (infeasible, with the estimate) and its engine never boots. The engine default is never screened;
3. otherwise the trial runs (``runner``: ``tuner.trial.run_trial``, or a table in the benchmark),
   with a pruner watching its workload (``tuner.pruning``) against the feasible trials so far;
4. the result is stored on the trial (``tuner.study.record``); a pruned trial ends PRUNED.

Every trial's memory estimate and the engine's own memory lines are stored, so each trial, booted
or not, calibrates the next ones, and the screen's hits and misses can be counted afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import optuna

from tuner.engines.base import Config
from tuner.memory import estimate
from tuner.memory_facts import observations
from tuner.outcome import TrialContext, TrialResult, WatchFactory
from tuner.pruning import FrontWatch
from tuner.space import Space, suggest
from tuner.study import DEFAULT_KIND, feasible_trials, record

SCREENED = "screened"
Runner = Callable[..., TrialResult]  # (number, config, ctx, watch=...) -> TrialResult


@dataclass
class SearchObjective:
    study: optuna.Study
    space: Space
    ctx: TrialContext
    objective: str = "pareto"
    screen: bool = True
    prune: bool = True
    runner: Runner | None = None  # None: tuner.trial.run_trial
    free_memory: Callable[[], int | None] = field(default=lambda: None)  # the GPU's free bytes now
    boots: int = 0  # trials of this run that booted an engine (screened ones do not)

    def __call__(self, trial: optuna.Trial) -> list[float]:
        is_default = trial.user_attrs.get("config_kind") == DEFAULT_KIND
        if not is_default:
            trial.set_user_attr("config_kind", "sampled")
        ctx = self.ctx
        config = suggest(trial, self.space, list(ctx.engines), list(ctx.model.drafts), is_default)
        finished = self.study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        adapter = ctx.engines[config.engine][0]
        est = estimate(
            config, ctx.model, ctx.device, observations([t.user_attrs for t in finished]),
            adapter.default_memory_fraction, adapter.kv_tokens_required(ctx.model), self.free_memory(),
        )  # fmt: skip
        if self.screen and not is_default and est is not None and not est.fits:
            result = self._screened(trial.number, config, est.as_dict())
        else:
            self.boots += 1
            result = self._run(trial.number, config, None if is_default or not self.prune else self._watch())
        result.memory_estimate = None if est is None else est.as_dict()
        values = record(trial, result, self.objective, ctx.slo)
        if result.pruned is not None:
            raise optuna.TrialPruned(f"pruned after {result.pruned['at_requests']} requests")
        return values

    def _run(self, number: int, config: Config, watch: WatchFactory | None) -> TrialResult:
        if self.runner is None:
            from tuner.trial import run_trial

            return run_trial(number, config, self.ctx, watch=watch)
        return self.runner(number, config, self.ctx, watch=watch)

    def _watch(self) -> WatchFactory:
        references = {t.number: t.user_attrs["checkpoints"] for t in feasible_trials(self.study)
                      if t.user_attrs.get("checkpoints")}  # fmt: skip

        def factory(n_total: int) -> FrontWatch:
            return FrontWatch(n_total, references, self.objective, self.ctx.slo, time.perf_counter())

        return factory

    def _screened(self, number: int, config: Config, est: dict[str, object]) -> TrialResult:
        adapter, env = self.ctx.engines[config.engine]
        launch = adapter.launch(config, self.ctx.model, self.ctx.device, 0, env.python, env.version)
        self.ctx.progress.phase(
            number, SCREENED,
            f"{config.engine} {_describe(config)}: KV cache for {est['predicted_tokens']} tokens predicted, "
            f"{est['required_tokens']} needed ({est['basis']}); not booted",
        )  # fmt: skip
        return TrialResult(config=config, launch=launch, engine_version=env.version, failure=SCREENED)


def _describe(config: Config) -> str:
    return " ".join(f"{k}={v}" for k, v in config.params.items())
