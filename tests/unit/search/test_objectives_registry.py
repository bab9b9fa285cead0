"""One registry of objectives: the flags' choices, the scoring, the finalists and the report read it."""

from __future__ import annotations

import argparse

import optuna

from tuner.cli.flags import build_parser
from tuner.report.capacity import is_capacity_study
from tuner.search.finalists import deciders
from tuner.search.scoring import OBJECTIVES, directions
from tuner.study.objectives import CAPACITY_OBJECTIVES, DEFAULT_OBJECTIVE, REGISTRY


def test_the_flag_offers_every_objective_and_defaults_to_the_registrys() -> None:
    parser = build_parser()
    search = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["search"]
    objective = next(a for a in search._actions if "--objective" in a.option_strings)
    assert tuple(objective.choices or ()) == tuple(REGISTRY) and objective.default == DEFAULT_OBJECTIVE


def test_scoring_finalists_and_report_agree_with_the_registry() -> None:
    for name, entry in REGISTRY.items():
        assert OBJECTIVES[name] == entry.values and directions(name) == [d for _, d in entry.values]
        for has_slo in (False, True):
            study = optuna.create_study(directions=directions(name))
            study.set_user_attr("objective", name)
            if has_slo:
                study.set_user_attr("slo", {"ttft_p95_ms": 300.0})
            assert deciders(study) == list(entry.deciders(has_slo))
            assert is_capacity_study(study) is (name in CAPACITY_OBJECTIVES) is entry.capacity
    assert REGISTRY["pareto"].deciders(True) == ("goodput_req_s",)
    assert REGISTRY["capacity-pareto"].deciders(False) == ("capacity_interactive_req_s", "capacity_relaxed_req_s")
