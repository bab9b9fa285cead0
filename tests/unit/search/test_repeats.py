"""Finalist repeats: Student-t intervals, the winner-or-tie verdict, and who gets repeated."""

from __future__ import annotations

import statistics

import optuna
import pytest

from tests.storage.test_storage import _result
from tuner.measure.statistics import interval
from tuner.search.finalists import judge, pick_finalists
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import enqueue_defaults


def test_interval_is_the_student_t_interval() -> None:
    samples = [10.0, 12.0, 11.0]
    out = interval(samples)
    sd = statistics.stdev(samples)
    assert out["mean"] == pytest.approx(11.0)
    assert out["high"] - out["mean"] == pytest.approx(4.303 * sd / 3**0.5)
    assert out["cv"] == pytest.approx(sd / 11.0)
    assert interval([5.0]) == {"n": 1, "mean": 5.0, "low": 5.0, "high": 5.0, "cv": 0.0}


def _finalist(trial: int, mean: float, half: float, failures: list[str] | None = None) -> dict[str, object]:
    stats = {"output_throughput_tok_s": {"n": 3, "mean": mean, "low": mean - half, "high": mean + half, "cv": 0.1}}
    return {"trial": trial, "config_kind": "sampled", "failures": failures or [], "stats": stats}


def test_a_winner_only_when_the_intervals_separate() -> None:
    key = "output_throughput_tok_s"
    assert judge([_finalist(1, 50, 2), _finalist(2, 40, 2)], key) == {"kind": "winner", "metric": key, "trials": [1]}
    assert judge([_finalist(1, 50, 6), _finalist(2, 42, 6)], key)["kind"] == "tie"
    assert judge([_finalist(1, 50, 6), _finalist(2, 42, 6)], key)["trials"] == [1, 2]
    # a finalist that failed a repeat cannot win, however fast its other runs were
    assert judge([_finalist(1, 90, 1, ["oom_load"]), _finalist(2, 40, 2)], key)["trials"] == [2]
    assert judge([], key)["kind"] == "none"


def test_finalists_are_the_best_feasible_plus_the_engine_default() -> None:
    study = optuna.create_study(directions=DIRECTIONS)
    enqueue_defaults(study, ["vllm"])
    for ttft, throughput, failure in [
        (100.0, 10.0, None),
        (90.0, 30.0, None),
        (120.0, 60.0, None),
        (1.0, 99.0, "oom_boot"),
    ]:
        trial = study.ask()
        trial.suggest_categorical("engine", ["vllm"])
        if trial.user_attrs.get("config_kind") is None:
            trial.set_user_attr("config_kind", "sampled")
        study.tell(trial, record(trial, _result(ttft, throughput, failure)))
    chosen = [t.number for t in pick_finalists(study, 1)]
    assert chosen == [2, 0], "the best throughput on the front, then the default as the reference"
    assert [t.number for t in pick_finalists(study, 5)] == [2, 1, 0]
