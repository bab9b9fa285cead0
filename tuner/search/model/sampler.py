"""``--sampler model``: each trial boots the config the performance model expects the most of.

An Optuna sampler, so storage, fleets and the dashboard work as with any other. For every trial it
proposes:

1. refit the model on the study's served trials (``EngineModel.fit``; warm-started from the last fit);
2. take the candidates: every config of a discrete space (up to ``GRID_WHOLE``), or ``DRAWN`` drawn
   from a larger or continuous one, less those the study already tried, those the memory screen
   says cannot fit (``tuner.search.memory``, calibrated on the study's boots), those the learned
   rejections refuse (``tuner.search.rejections``) and those whose draft was measured accepting next
   to nothing (``tuner.search.acceptance``): the objective would tell each without a boot;
3. predict each one's capacity under every scored tier, over the machine's cores
   (``tuner.search.model.parallel``), and boot the one with the highest expected
   improvement over the best capacity measured so far (``expected_improvement``: the model's own
   error on this study, widened by what it has not measured, such as a draft never booted); an
   engine never booted is worth a boot before anything is predicted for it.

Before anything has served a step (the engine default left out) the first trial is a seeded random
candidate, without speculation where the space has one (a fit of speculative steps alone cannot tell
the target's costs from the drafting's: ``tuner.search.model.predict``). Every trial stores what
was predicted for it before it booted (``predicted``), the engine default and other enqueued trials
included, so ``tuner trials`` and the report set predictions against measurements, and the model's
error on this study is known.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from tokenizers import Tokenizer

from tuner.engines.base import Config, Device, EngineAdapter, ModelSpec
from tuner.errors import ConfigError, WorkloadError
from tuner.measure.rate_steps import CapacityPlan
from tuner.measure.trial import TrialContext
from tuner.progress import Progress, Quiet
from tuner.search.acceptance import MEASURED_STATES
from tuner.search.grid import grid_points
from tuner.search.learned import learned_screen
from tuner.search.memory import estimate, observations
from tuner.search.model.fit import Fit
from tuner.search.model.history import Served, served_of, speculation
from tuner.search.model.parallel import default_workers
from tuner.search.model.predict import EngineModel, Prediction, expected_improvement, model_sigma
from tuner.search.model.requests import StudyRequests
from tuner.search.space import Space, distributions, suggest
from tuner.search.speculation import Offer
from tuner.study.attrs import DEFAULT_KIND, TrialAttrs, checked_trial_attrs, predicted_claim, trial_attrs
from tuner.study.feasible import feasible_trials
from tuner.workloads.base import load_tokenizer

GRID_WHOLE = 256  # a discrete space up to this many configs is scored whole at every proposal
# configs drawn from a larger (or continuous) space at each proposal: every one costs a simulated
# capacity search (two where a draft is unmeasured), so their number is what a proposal costs
# (reports/model-sampler.md, "What a proposal costs")
DRAWN = 64
PREDICTED = "predicted"


@dataclass(frozen=True)
class ModelContext:
    """What the sampler needs of the study beyond its trials: the space and the engines that run
    here, the drafts, the model and the device (for the memory screen), the capacity plan, and the
    workload's requests in order with each one's prompt blocks by request id (grown on demand)."""

    space: Space
    adapters: Mapping[str, EngineAdapter]
    offers: Mapping[str, Offer]  # what each engine may speculate with (tuner.search.speculation)
    model: ModelSpec
    device: Device
    plan: CapacityPlan
    requests: StudyRequests
    versions: Mapping[str, str] = field(default_factory=dict)  # each engine's version (absent: refusals unchecked)
    # where a proposal says what it predicted and how long it took: a study waits for it, seconds on a
    # CPU and more on a GPU study's steps, and should not look stalled meanwhile
    progress: Progress = field(default_factory=Quiet)


@dataclass(frozen=True)
class Scored:
    point: dict[str, Any]
    config: Config
    predictions: dict[str, Prediction]
    gain: float


class ModelSampler(optuna.samplers.BaseSampler):
    """Proposes the candidate with the highest expected improvement (see the module docstring).
    ``bind`` gives it the study's context before the first trial; unbound it samples at random."""

    def __init__(self, seed: int | None = None, drawn: int = DRAWN, workers: int | None = None) -> None:
        """``drawn``: candidates drawn from a space too large to score whole; ``workers``: processes
        the fit's and the candidates' simulations are spread over (None: a core each,
        ``tuner.search.model.parallel``)."""
        self._seed = seed
        self._drawn = drawn
        self._workers = default_workers() if workers is None else workers
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._context: ModelContext | None = None
        self._cache: tuple[tuple[Any, ...], EngineModel] | None = None
        self._fits: dict[str, Fit] = {}

    def bind(self, context: ModelContext) -> None:
        self._context = context

    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial
    ) -> dict[str, BaseDistribution]:
        c = self._context
        return {} if c is None else distributions(c.space, c.offers)

    def sample_relative(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        c = self._context
        if c is None or not search_space:
            return {}
        if trial.system_attrs.get("fixed_params"):
            return {}  # enqueued: predicted in before_trial, not chosen here
        began = time.monotonic()
        model = self.model(study)
        candidates = self._candidates(study, trial.number)
        if not candidates:
            return {}
        best = self._best(study)
        sigma = model_sigma(_record(study, c.plan.scored[0]))
        said = model.predict_many([(config.engine, config.params, kv) for _, config, kv in candidates],
                                  self._workers if model.fits else 1)  # fmt: skip
        scored = [
            self._scored(point, config, p, best, sigma) for (point, config, _), p in zip(candidates, said, strict=True)
        ]
        rng = random.Random(f"{self._seed}:{trial.number}")
        if not model.fits:  # nothing served yet: nothing to predict from
            # the target alone first where the space has it: a fit of speculative steps alone cannot
            # tell the target's costs from the drafting's (tuner.search.model.predict)
            plain = [s for s in scored if speculation(s.config.params, 0.0) is None]
            choice = rng.choice(plain or scored)
        else:
            choice = max(scored, key=lambda s: (s.gain, _central(s.predictions, c.plan.scored[0]), rng.random()))
        self._store(study, trial, choice.predictions, choice.gain, len(candidates))
        trials = f"{model.trials} served trial" + ("s" if model.trials != 1 else "")
        how = (f"{len(candidates)} candidates predicted in {time.monotonic() - began:.0f} s, fitted on {trials}"
               if model.fits else "nothing served yet: a random candidate")  # fmt: skip
        c.progress.phase(trial.number, "propose", f"{how}; expects {_expects(choice.predictions)}")
        return {k: v for k, v in choice.point.items() if k in search_space}

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        """An enqueued trial (the engine default, a config the objective queued) samples nothing, so
        Optuna never asks for its relative params: its prediction is stored here."""
        fixed = trial.system_attrs.get("fixed_params")
        if self._context is None or not fixed:
            return
        default = trial.user_attrs.get("config_kind") == DEFAULT_KIND
        config = _config(self._context, dict(fixed), default)
        model = self.model(study)
        predictions = self._predict(model, study, config)
        self._store(study, trial, predictions, None, 0)
        if model.fits:  # before anything served there is nothing to say
            self._context.progress.phase(trial.number, "predict", f"expects {_expects(predictions)}")

    def sample_independent(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, name: str, dist: BaseDistribution
    ) -> Any:
        return self._random.sample_independent(study, trial, name, dist)

    def model(self, study: optuna.Study) -> EngineModel:
        """The model fitted on the study's served trials (refitted only when they changed)."""
        c = self._context
        assert c is not None
        done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED))  # fmt: skip
        served = [(t.number, s) for t in done if (s := served_of(t, c.requests)) is not None]
        key = tuple(n for n, _ in served)
        if self._cache is None or self._cache[0] != key:
            model = EngineModel.fit([s for _, s in served], c.adapters, c.device, c.plan, c.requests, self._fits,
                                    workers=self._workers)  # fmt: skip
            self._fits = dict(model.fits)
            self._cache = (key, model)
        return self._cache[1]

    def _predict(self, model: EngineModel, study: optuna.Study, config: Config) -> dict[str, Prediction]:
        return model.predict(config.engine, config.params, self._kv_tokens(study, config))

    def _kv_tokens(self, study: optuna.Study, config: Config) -> int | None:
        """The config's KV pool as the memory screen predicts it, calibrated on the study's boots."""
        c = self._context
        assert c is not None
        adapter = c.adapters[config.engine]
        finished = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        est = estimate(config, c.model, c.device, observations([t.user_attrs for t in finished]),
                       adapter.default_memory_fraction, adapter.kv_tokens_required(c.model))  # fmt: skip
        return None if est is None else est.predicted_tokens

    def _scored(
        self, point: dict[str, Any], config: Config, predictions: dict[str, Prediction], best: dict[str, float],
        sigma: float,
    ) -> Scored:  # fmt: skip
        gains = []
        for tier, p in predictions.items():
            gain = expected_improvement(p, best.get(tier, 0.0), sigma)
            gains.append(gain / best[tier] if best.get(tier) else gain)  # tiers compared as shares of their best
        return Scored(point, config, predictions, sum(gains))

    def _best(self, study: optuna.Study) -> dict[str, float]:
        """Each scored tier's best capacity measured so far among the feasible trials."""
        c = self._context
        assert c is not None
        best: dict[str, float] = {}
        for t in feasible_trials(study):
            for tier in c.plan.scored:
                value = (trial_attrs(t).get("metrics") or {}).get(f"capacity_{tier}_req_s")
                if isinstance(value, int | float) and value > best.get(tier, 0.0):
                    best[tier] = float(value)
        return best

    def _candidates(self, study: optuna.Study, number: int) -> list[tuple[dict[str, Any], Config, int | None]]:
        """Configs worth predicting: not tried yet, not screened out, not refused by the engine (its own
        validation, or like an earlier config), no draft measured idle; each with the KV pool the memory screen gives it
        (``_kv_tokens``, from the estimate that screened it)."""
        c = self._context
        assert c is not None
        try:
            points = grid_points(c.space, c.offers)
        except ConfigError:  # a continuous space: a seeded draw of it
            points = []
        if not points or len(points) > GRID_WHOLE:
            rng = random.Random(f"{self._seed}:candidates:{number}")
            dists = distributions(c.space, c.offers)
            points = [_draw(dists, rng) for _ in range(self._drawn)]  # fewer draws: the first ones of more
        tried = [t.params for t in study.get_trials(deepcopy=False) if t.params]
        ran = study.get_trials(deepcopy=False, states=MEASURED_STATES)
        finished = [t for t in ran if t.state == optuna.trial.TrialState.COMPLETE]
        history = observations([t.user_attrs for t in finished])
        out: list[tuple[dict[str, Any], Config, int | None]] = []
        for point in points:
            config, canonical = _suggested(c, point, False)
            if canonical in tried or any(canonical == o for o, _, _ in out):
                continue
            adapter = c.adapters[config.engine]
            est = estimate(config, c.model, c.device, history, adapter.default_memory_fraction,
                           adapter.kv_tokens_required(c.model))  # fmt: skip
            if (est is not None and not est.fits) or learned_screen(config, ran, adapter) is not None:
                continue  # the objective would tell it without a boot
            version = c.versions.get(config.engine)
            if (
                version is not None
                and adapter.refusal(config.params, c.device, version, config.enforce_eager) is not None
            ):
                continue
            out.append((canonical, config, None if est is None else est.predicted_tokens))
        return out

    def _store(
        self, study: optuna.Study, trial: optuna.trial.FrozenTrial, predictions: Mapping[str, Prediction],
        gain: float | None, candidates: int,
    ) -> None:  # fmt: skip
        c = self._context
        assert c is not None
        value = {
            "tiers": {tier: p.as_dict() for tier, p in predictions.items()},
            "sigma": model_sigma(_record(study, c.plan.scored[0])),
            "expected_gain": None if gain is None or not math.isfinite(gain) else gain,
            "candidates": candidates,
            "fitted_on": self._cache[1].trials if self._cache is not None else 0,
        }
        # a sampler holds the frozen trial, so the storage takes the checked record directly
        for key, stored in checked_trial_attrs(TrialAttrs(predicted=value)).items():
            study._storage.set_trial_user_attr(trial._trial_id, key, stored)  # noqa: SLF001


def _expects(predictions: Mapping[str, Prediction]) -> str:
    """Each tier's predicted capacity for a progress line, with its range where a part is unmeasured."""
    said = []
    for tier, p in predictions.items():
        if p.capacity_req_s is None:
            said.append(f"{tier} n/a")
        elif p.low_req_s is not None and p.high_req_s is not None and p.low_req_s != p.high_req_s:
            said.append(f"{tier} {p.capacity_req_s:.3g} req/s ({p.low_req_s:.3g}-{p.high_req_s:.3g})")
        else:
            said.append(f"{tier} {p.capacity_req_s:.3g} req/s")
    return ", ".join(said)


def _config(c: ModelContext, point: Mapping[str, Any], default: bool) -> Config:
    """The config a trial with these Optuna params runs: ``suggest`` itself, on a fixed trial."""
    return _suggested(c, point, default)[0]


def _suggested(c: ModelContext, point: Mapping[str, Any], default: bool) -> tuple[Config, dict[str, Any]]:
    """The config ``point`` runs and the params a trial records for it: exactly those ``suggest``
    asked for (no draft without speculation; a draft under its method's own name), read off the fixed
    trial, so a proposal names every param Optuna will ask for and matches a tried trial's params."""
    fixed = optuna.trial.FixedTrial(dict(point))
    config = suggest(cast(optuna.Trial, fixed), c.space, c.offers, default)  # answers every suggest_* as Trial does
    return config, dict(fixed.params)


def _draw(dists: Mapping[str, BaseDistribution], rng: random.Random) -> dict[str, Any]:
    """One point of the space, uniform in each parameter (the engine first, then its own)."""
    engine_dist = dists["engine"]
    assert isinstance(engine_dist, CategoricalDistribution)
    engine = rng.choice(list(engine_dist.choices))
    point: dict[str, Any] = {"engine": engine}
    for name, dist in dists.items():
        if not name.startswith(f"{engine}."):
            continue
        if isinstance(dist, CategoricalDistribution):
            point[name] = rng.choice(list(dist.choices))
        elif isinstance(dist, IntDistribution):
            point[name] = rng.randint(dist.low, dist.high)
        elif isinstance(dist, FloatDistribution):
            steps = int(round((dist.high - dist.low) / dist.step)) if dist.step else 0
            point[name] = (
                dist.low + rng.randint(0, steps) * dist.step if dist.step else rng.uniform(dist.low, dist.high)
            )
    return point


def _central(predictions: Mapping[str, Prediction], tier: str) -> float:
    value = predictions[tier].capacity_req_s
    return math.inf if value is None else value


def _record(study: optuna.Study, tier: str) -> list[tuple[float, float]]:
    """(predicted before it booted, measured) capacities of the study's trials under ``tier``; a
    prediction without a range (``high_req_s`` None: the model said it could not bound it) is no claim
    of the model's and is left out."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
        a = t.user_attrs
        predicted = ((a.get(PREDICTED) or {}).get("tiers") or {}).get(tier) or {}
        measured = (a.get("metrics") or {}).get(f"capacity_{tier}_req_s")
        claim = predicted_claim(predicted)
        if a.get("failure") is None and claim is not None and measured:
            out.append((claim, float(measured)))
    return out


def context_of(space: Space, ctx: TrialContext, offers: Mapping[str, Offer]) -> ModelContext:
    """The sampler's context from a study's trial context: its workload's requests become the ones
    the model simulates, grown as a capacity search grows them, each prompt cut into blocks with the
    target's tokenizer (none where the tokenizer cannot be read: the model then spreads each step's
    measured prefix hits instead)."""
    if ctx.capacity is None:
        raise ConfigError("--sampler model predicts capacity: use --objective capacity or capacity-pareto")
    try:
        tokenizer: Tokenizer | None = load_tokenizer(Path(ctx.model.path))
    except WorkloadError:
        tokenizer = None
    requests = StudyRequests.of_workload(ctx.workload.requests, ctx.workload.grow, tokenizer)
    adapters = {name: adapter for name, (adapter, _) in ctx.engines.items()}
    versions = {name: env.version for name, (_, env) in ctx.engines.items()}
    return ModelContext(space, adapters, offers, ctx.model, ctx.device, ctx.capacity, requests, versions,
                        ctx.progress)  # fmt: skip


def served_trials(study: optuna.Study, blocks: Mapping[str, tuple[int, ...]] | StudyRequests) -> list[Served]:
    """Every trial of ``study`` the model can learn from."""
    trials = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED))
    return [s for t in trials if (s := served_of(t, blocks)) is not None]
