"""``--sampler tpe|gp|nsga2|random|grid``: which Optuna sampler proposes the next config.

Every sampler sees failures: a trial that broke (or was screened) carries a positive constraint
through ``Trial.set_constraint``, which TPE, GP and NSGA-II read, so they steer away from where
engines break; random and grid ignore it, which is what the benchmark compares against.

* ``tpe`` (the default, chosen by ``tests/benchmarks/bench_search.py``: see ``reports/search.md``):
  multivariate TPE over the joint space, grouped so an engine's own parameters are modelled
  together, with a short random start (``TPE_STARTUP`` trials) because a study is only tens of
  boots long. ``constant_liar`` makes it safe for parallel workers: a running trial counts as a bad
  result, so two workers do not propose the same point.
* ``gp``: Optuna's Gaussian-process sampler (needs torch and scipy: ``pip install 'tuner[gp]'``).
* ``nsga2``: a genetic algorithm; strong on long studies, slow to start on short ones.
* ``random``: uniform sampling, the baseline a search must beat.
* ``grid``: every distinct config of a discrete space (``tuner.grid``), in a seeded order; the study
  enqueues them and a random sampler fills any trial left over.
"""

from __future__ import annotations

import warnings

import optuna

from tuner.errors import ConfigError

SAMPLERS = ("tpe", "gp", "nsga2", "random", "grid")
TPE_STARTUP = 5
NSGA2_POPULATION = 8


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
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=TPE_STARTUP)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=NSGA2_POPULATION)
    if name in ("random", "grid"):
        return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"--sampler {name!r}: expected one of {', '.join(SAMPLERS)}")
