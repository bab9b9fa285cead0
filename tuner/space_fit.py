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
from tuner.space import CountChoices, FractionChoices, Space


def distributions(space: Space, engines: Sequence[str], drafts: Sequence[str]) -> dict[str, BaseDistribution]:
    """Every distribution ``space.suggest`` can ask for, by parameter name (the same names and kinds)."""
    out: dict[str, BaseDistribution] = {"engine": CategoricalDistribution(list(engines))}
    p = space.parameters
    for engine in engines:
        name = f"{engine}.{{}}".format
        for key in ("chunk_size", "max_num_seqs", "tensor_parallel"):
            choices = getattr(p, key)
            if choices is not None:
                out[name(key)] = CategoricalDistribution(choices.choices)
        if isinstance(p.memory_fraction, FractionChoices):
            out[name("memory_fraction")] = CategoricalDistribution(p.memory_fraction.choices)
        elif p.memory_fraction is not None:
            r = p.memory_fraction
            out[name("memory_fraction")] = FloatDistribution(r.low, r.high, step=r.step)
        draft_choices = list(p.draft_model.choices) if p.draft_model is not None else list(drafts)
        ks = p.num_speculative_tokens
        if ks is None or not draft_choices:
            continue
        if isinstance(ks, CountChoices):
            out[name("num_speculative_tokens")] = CategoricalDistribution(ks.choices)
        else:
            out[name("num_speculative_tokens")] = IntDistribution(ks.low, ks.high)
        out[name("draft_model")] = CategoricalDistribution(draft_choices)
    return out


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
