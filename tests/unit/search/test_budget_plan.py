"""A study's budget: flags win, else the CPU default's or the full default's, and the help says which."""

from __future__ import annotations

import argparse

import pytest

from tuner.cli.flags import build_parser
from tuner.engines.base import Device
from tuner.errors import ConfigError
from tuner.search.options import CPU_DEFAULT_PLAN, DEFAULT_PLAN, Plan, SearchOptions, plan_of

CPU, GPU = Device("cpu", "CPU", 2**30), Device("cuda", "GPU", 2**37)


def test_the_embedded_cpu_default_gets_its_own_budget_and_everything_else_the_full_one() -> None:
    assert plan_of(SearchOptions(workload="rag"), CPU) == CPU_DEFAULT_PLAN
    assert plan_of(SearchOptions(workload="rag", model="/models/m"), CPU) == DEFAULT_PLAN  # the user's model
    assert plan_of(SearchOptions(workload="rag"), GPU) == DEFAULT_PLAN
    assert plan_of(SearchOptions(workload="rag", trials=9, repeats=0), CPU) == Plan(9, CPU_DEFAULT_PLAN.finalists, 0)
    with pytest.raises(ConfigError, match="at least 0"):
        plan_of(SearchOptions(workload="rag", finalists=-1), GPU)


def test_the_help_states_the_budgets_from_the_same_constants() -> None:
    parser = build_parser()
    search = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["search"]
    helps = {a.option_strings[0]: a.help or "" for a in search._actions if a.option_strings}
    for flag, field in (("--trials", "trials"), ("--finalists", "finalists"), ("--repeats", "repeats")):
        assert f"default {getattr(DEFAULT_PLAN, field)};" in helps[flag]
        assert f"CPU default {getattr(CPU_DEFAULT_PLAN, field)}" in helps[flag]
