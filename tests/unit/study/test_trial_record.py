"""One record of a trial: ``TrialAttrs`` declares every key, every key written is declared, and every
key declared is written somewhere (but those only older tuners wrote)."""

from __future__ import annotations

import ast
from dataclasses import fields
from pathlib import Path

import optuna
import pytest

from tuner.measure.trial import TrialResult
from tuner.search.objective import NOT_RECORDED, RECORDED_AS_IS, RECORDED_DERIVED
from tuner.study.attrs import LEGACY_TRIAL_KEYS, TRIAL_KEYS, TrialAttrs, checked_trial_attrs, write_trial_attrs
from tuner.workloads.base import TIER_NAMES

PACKAGE = Path(__file__).resolve().parents[3] / "tuner"


def written_keys() -> set[str]:
    """Every key the package writes: the keywords of each ``TrialAttrs(...)`` it builds, the result
    fields ``record`` stores as they are, and each tier's flat capacity."""
    keys = set(RECORDED_AS_IS) | {f"capacity_{tier}_req_s" for tier in TIER_NAMES}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "TrialAttrs":
                keys |= {k.arg for k in node.keywords if k.arg is not None}
    return keys


def test_every_key_written_is_declared_and_every_declared_key_is_written() -> None:
    written = written_keys()
    assert written - TRIAL_KEYS == set(), "written but not declared in TrialAttrs"
    assert TRIAL_KEYS - LEGACY_TRIAL_KEYS - written == set(), "declared in TrialAttrs but never written"


def test_every_field_of_a_trial_result_is_recorded_or_said_not_to_be() -> None:
    names = {f.name for f in fields(TrialResult)}
    assert set(RECORDED_AS_IS) <= TRIAL_KEYS
    assert names == set(RECORDED_AS_IS) | RECORDED_DERIVED | NOT_RECORDED
    assert not (RECORDED_DERIVED & NOT_RECORDED)


def test_a_key_not_declared_is_refused_and_nothing_is_written() -> None:
    study = optuna.create_study()
    trial = study.ask()
    with pytest.raises(KeyError, match="not declared in TrialAttrs: ttft_p99_ms"):
        write_trial_attrs(trial, {"booted": True, "ttft_p99_ms": 1.0})  # type: ignore[typeddict-unknown-key]
    assert trial.user_attrs == {}
    with pytest.raises(KeyError, match="argv"):  # what older tuners wrote is read, never written now
        checked_trial_attrs({"argv": ["python"]})


def test_values_are_stored_as_json() -> None:
    study = optuna.create_study()
    trial = study.ask()
    write_trial_attrs(trial, TrialAttrs(launch={"args": ("--model", "m")}, worker={"gpus": (0, 1)}))
    assert trial.user_attrs["launch"] == {"args": ["--model", "m"]}
    assert trial.user_attrs["worker"] == {"gpus": [0, 1]}
