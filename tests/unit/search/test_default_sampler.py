"""Without ``--sampler`` a study gets the performance model where it can predict the objective
(capacity), and TPE for the closed-loop objectives; a sampler asked for is always the one run."""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna
import pytest

from tuner.cli.flags import build_parser
from tuner.search.model.sampler import ModelSampler
from tuner.search.options import SearchOptions
from tuner.search.run import open_for
from tuner.search.samplers import default_sampler
from tuner.study.objectives import CAPACITY_OBJECTIVES, REGISTRY


def test_the_capacity_objectives_default_to_the_model_and_the_others_to_tpe() -> None:
    assert CAPACITY_OBJECTIVES, "the registry names no capacity objective"
    for name in REGISTRY:
        assert default_sampler(name) == ("model" if name in CAPACITY_OBJECTIVES else "tpe"), name


@pytest.mark.parametrize(("objective", "given", "expected"), [
    ("capacity", None, "model"), ("capacity-pareto", None, "model"), ("goodput", None, "tpe"),
    ("capacity", "random", "random"), ("goodput", "grid", "grid"),
])  # fmt: skip
def test_a_given_sampler_wins_and_none_follows_the_objective(objective: str, given: str | None, expected: str) -> None:
    assert SearchOptions(workload="rag", objective=objective, sampler=given).sampler_name() == expected


def test_the_flag_leaves_the_choice_to_the_objective_and_says_so() -> None:
    parser = build_parser()
    search = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["search"]
    action = next(a for a in search._actions if "--sampler" in a.option_strings)
    assert action.default is None
    assert "model for the capacity objectives" in (action.help or "") and "tpe" in (action.help or "")


def test_a_study_opened_without_a_sampler_gets_the_objectives_default(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    capacity = open_for(SearchOptions(workload="rag"), "cap", url)
    assert isinstance(capacity.sampler, ModelSampler)
    goodput = open_for(SearchOptions(workload="rag", objective="goodput"), "good", url)
    assert isinstance(goodput.sampler, optuna.samplers.TPESampler)
