"""Whether a search space can go on in a study that already holds trials.

Optuna stores every parameter's distribution with the trial, and its storage refuses a parameter
whose kind changes, or a categorical one whose choices change, within one study (a ValueError from
deep inside ``suggest_*``, mid-trial). A range may be narrowed or widened freely. So a resumed
search with another space is checked before any trial starts, and a change Optuna would refuse is
one ConfigError naming the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
    check_distribution_compatibility,
)

from tuner.errors import ConfigError
from tuner.space import Space, distributions


def check_space_fits(study: optuna.Study, space: Space, engines: Sequence[str], drafts: Sequence[str]) -> None:
    """Refuse, in one line, a space whose parameters Optuna would reject in this study's trials."""
    planned = distributions(space, engines, drafts)
    seen: set[str] = set()
    for trial in study.get_trials(deepcopy=False):
        for param, old in trial.distributions.items():
            new = planned.get(param)
            if new is None or param in seen:
                continue
            seen.add(param)
            try:
                check_distribution_compatibility(old, new)
            except ValueError:
                raise ConfigError(
                    f"study {study.study_name!r} searched {param} over {_describe(old)}; this space makes it "
                    f"{_describe(new)}, which Optuna cannot mix in one study: keep its choices (a range may "
                    "change) or use another --study"
                ) from None


def _describe(dist: BaseDistribution) -> str:
    if isinstance(dist, CategoricalDistribution):
        return "choices [" + ", ".join(str(c) for c in dist.choices) + "]"
    if isinstance(dist, (FloatDistribution, IntDistribution)):
        return f"the range {dist.low}..{dist.high}"
    return type(dist).__name__
