"""A resumed search with another space: what Optuna would refuse mid-trial is refused up front, in one line."""

from __future__ import annotations

import optuna
import pytest

from tests.unit.search.offers import offers
from tuner.errors import ConfigError
from tuner.report.trials_table import search_effort
from tuner.search.space import Space, check_space_fits, distributions, suggest

FULL = {
    "engines": ["vllm", "sglang"],
    "parameters": {
        "chunk_size": {"choices": [512, 1024, 2048]},
        "max_num_seqs": {"choices": [2, 4]},
        "memory_fraction": {"low": 0.5, "high": 0.9, "step": 0.1},
        "spec_method": {"choices": ["off", "draft_model"]},
        "num_speculative_tokens": {"low": 1, "high": 3},
    },
}


def _study(space: Space, n: int = 12) -> optuna.Study:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(n):
        trial = study.ask()
        suggest(trial, space, offers(space), is_default=False)
        study.tell(trial, 1.0)
    return study


def _with(**parameters: object) -> Space:
    raw = {**FULL, "parameters": {**FULL["parameters"], **parameters}}
    return Space.model_validate(raw)


def test_distributions_are_exactly_what_suggest_asks_for() -> None:
    space = Space.model_validate(FULL)
    study = _study(space, 40)
    planned = distributions(space, offers(space))
    asked = {name: dist for t in study.trials for name, dist in t.distributions.items()}
    assert asked == {name: planned[name] for name in asked}
    assert set(asked) == set(planned), "40 random trials reach every parameter of this space"


def test_a_narrowed_range_goes_on_in_the_same_study() -> None:
    study = _study(Space.model_validate(FULL))
    narrowed = _with(
        memory_fraction={"low": 0.7, "high": 0.8, "step": 0.1}, num_speculative_tokens={"low": 1, "high": 2}
    )
    check_space_fits(study, narrowed, offers(narrowed))
    trial = study.ask()  # and Optuna itself agrees
    suggest(trial, narrowed, offers(narrowed), is_default=False)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"chunk_size": {"choices": [512, 4096]}}, "chunk_size over choices [512, 1024, 2048]"),
        ({"memory_fraction": {"choices": [0.5, 0.9]}}, "memory_fraction over the range 0.5..0.9"),
        ({"num_speculative_tokens": {"choices": [1, 2]}}, "num_speculative_tokens over the range 1..3"),
        ({"spec_method": {"choices": ["off", "draft_model", "ngram"]}}, "spec_method over choices [off, draft_model]"),
    ],
)
def test_a_change_optuna_refuses_is_one_line_naming_the_parameter(change: dict[str, object], named: str) -> None:
    study = _study(Space.model_validate(FULL))
    changed = _with(**change)
    with pytest.raises(ConfigError) as info:
        check_space_fits(study, changed, offers(changed))
    message = str(info.value)
    assert named in message and "--study" in message and "\n" not in message
    with pytest.raises(ValueError):  # what the user would have got, from deep inside a trial
        for _ in range(20):
            suggest(study.ask(), changed, offers(changed), is_default=False)


def test_another_engine_list_is_refused_too() -> None:
    study = _study(Space.model_validate(FULL))
    only_vllm = Space.model_validate({**FULL, "engines": ["vllm"]})
    with pytest.raises(ConfigError, match=r"searched engine over choices \[vllm, sglang\]"):
        check_space_fits(study, only_vllm, offers(only_vllm))


def test_the_effort_line_counts_twins_as_not_booted() -> None:
    study = optuna.create_study()
    for attrs in ({"booted": True, "boot_s": 30.0}, {"booted": False, "boot_s": 30.0, "duplicate_of": 0},
                  {"booted": False, "failure": "screened"}, {"boot_s": 31.0}):  # fmt: skip
        trial = study.ask()
        for key, value in attrs.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)
    line = search_effort(study)
    assert line.startswith("4 trials: 2 booted an engine, 1 screened"), line
    assert "1 told from an earlier trial" in line
