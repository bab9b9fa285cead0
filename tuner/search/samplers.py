"""``--sampler tpe|gp|nsga2|random|grid|model``: which Optuna sampler proposes the next config.

Every sampler sees failures: a trial that broke (or was screened) carries a positive constraint
through ``Trial.set_constraint``, which TPE, GP and NSGA-II read, so they steer away from where
engines break; random and grid ignore it, which is what the benchmark compares against.

* ``tpe`` (the default for the closed-loop objectives, chosen by ``tests/benchmarks/bench_search.py``:
  see ``reports/search.md``): multivariate TPE over the joint space, grouped so an engine's own
  parameters (and the draft, sampled only with speculation on) are modelled together, after
  ``TPE_STARTUP`` random trials.
  On the measured grid it reached every seed's target, where univariate TPE got stuck on 2 of 40
  and a 5-trial start did worse than random. ``constant_liar`` makes it safe for parallel workers: a
  running trial counts as a bad result, so two workers do not propose the same point.
* ``gp``: Optuna's Gaussian-process sampler (needs torch and scipy: ``pip install 'tuner[gp]'``).
* ``nsga2``: a genetic algorithm; strong on long studies, slow to start on short ones.

GP and NSGA-II see the study's sampled trials only (``SampledOnly``: see why there).
* ``random``: uniform sampling, the baseline a search must beat.
* ``grid``: every distinct config of a discrete space (``tuner.search.grid``), in a seeded order; the study
  enqueues them and a random sampler fills any trial left over.
* ``model`` (the default for the capacity objectives, chosen by ``tests/benchmarks/bench_model.py``:
  see ``reports/search.md``, "The performance model: search"): the performance model
  (``tuner.search.model``) fitted on the study's own trials predicts every candidate's capacity, and
  the one with the highest expected improvement boots; capacity objectives only, and bound to the
  study's context by ``tuner.search.run``.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import optuna

from tuner.errors import ConfigError
from tuner.search.model.sampler import ModelSampler
from tuner.study.attrs import DEFAULT_KIND, STRESS_CHECK_KIND
from tuner.study.objectives import is_capacity

SAMPLERS = ("tpe", "gp", "nsga2", "random", "grid", "model")
TPE_STARTUP = 10
NSGA2_POPULATION = 8


def _sampled(t: optuna.trial.FrozenTrial) -> bool:
    """A trial the sampler proposed (or is proposing): not the engine default, a repeat of an
    earlier outcome, or a stress-check record."""
    a = t.user_attrs
    return a.get("config_kind") not in (DEFAULT_KIND, STRESS_CHECK_KIND) and a.get("duplicate_of") is None


class _SampledView:
    """The study as a sampler should see it: its sampled trials only (everything else delegated)."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self._study._get_trials(*args, **kwargs) if _sampled(t)]  # noqa: SLF001

    def get_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        return [t for t in self._study.get_trials(*args, **kwargs) if _sampled(t)]

    @property
    def trials(self) -> list[optuna.trial.FrozenTrial]:
        return self.get_trials()


class SampledOnly(optuna.samplers.BaseSampler):
    """``inner`` (GP, NSGA-II) fed the sampled trials only. Both model the intersection of every
    finished trial's parameters and train on every finished trial, and the engine default (trial 0)
    has only ``engine``: left alone they would model nothing and sample at random all study long
    (the search benchmark caught them giving random search's very sequence), or fail on the
    default's missing parameters."""

    def __init__(self, inner: optuna.samplers.BaseSampler) -> None:
        self._inner = inner

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> Any:
        return self._inner.infer_relative_search_space(_SampledView(study), trial)  # type: ignore[arg-type]

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, space: Any) -> Any:
        return self._inner.sample_relative(_SampledView(study), trial, space)  # type: ignore[arg-type]

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, name: str, dist: Any) -> Any:
        return self._inner.sample_independent(_SampledView(study), trial, name, dist)  # type: ignore[arg-type]

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self._inner.before_trial(_SampledView(study), trial)  # type: ignore[arg-type]

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: Any, values: Any) -> None:
        self._inner.after_trial(_SampledView(study), trial, state, values)  # type: ignore[arg-type]

    def reseed_rng(self) -> None:
        self._inner.reseed_rng()


def default_sampler(objective: str) -> str:
    """The sampler a study gets without ``--sampler``: the performance model where it can predict the
    objective (capacity), TPE otherwise. On both CPU capacity tables the model came within 10 % of
    the best in fewer boots than TPE and random search, and never in more (reports/search.md); its
    proposals' seconds do not lengthen the Quickstart's study against TPE's (reports/quickstart.md,
    both timed in turn)."""
    return "model" if is_capacity(objective) else "tpe"


def resumed_seed(seed: int | None, trials: int, process: str = "") -> int | None:
    """The seed for a sampler on a study that holds ``trials`` already (``process``: a fleet worker's
    host and pid, else empty). A sampler draws from its seed alone, so the same seed on a resumed study
    replays the draws it made before: while it still samples at random each is a config measured
    already (told from its twin without a boot, and no new point), and two workers seeded alike propose
    the same configs at once. A fresh study of one process keeps ``seed`` as given; otherwise the seed
    is drawn from ``seed``, ``trials`` and ``process``, so a resumed study is still reproducible."""
    if seed is None or (trials == 0 and not process):
        return seed
    digest = hashlib.sha256(f"{seed}/{trials}/{process}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    if name == "tpe":
        with warnings.catch_warnings():  # multivariate, group and constant_liar are "experimental"
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(
                seed=seed, n_startup_trials=TPE_STARTUP, multivariate=True, group=True, constant_liar=True
            )
    if name == "gp":
        try:
            import scipy  # noqa: F401
            import torch  # noqa: F401
        except ImportError as exc:
            raise ConfigError("--sampler gp needs torch and scipy: pip install 'tuner[gp]'") from exc
        return SampledOnly(optuna.samplers.GPSampler(seed=seed, n_startup_trials=TPE_STARTUP))
    if name == "nsga2":
        return SampledOnly(optuna.samplers.NSGAIISampler(seed=seed, population_size=NSGA2_POPULATION))
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "model":
        return ModelSampler(seed=seed)
    raise ConfigError(f"--sampler {name!r}: expected one of {', '.join(SAMPLERS)}")
