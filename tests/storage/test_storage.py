"""The study layer against real storages: SQLite files and a real PostgreSQL.

``scripts/test.sh`` starts a throwaway PostgreSQL and exports ``TUNER_TEST_POSTGRES``; without it
(a bare ``pytest`` run) the PostgreSQL cases are skipped, and CI always has it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest

from tuner.engines.base import Config, LaunchSpec
from tuner.errors import ConfigError
from tuner.measure.trial import TrialResult
from tuner.report.trials_table import trials_table
from tuner.search.objective import record
from tuner.search.samplers import make_sampler
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import bind_study_attrs, enqueue_defaults
from tuner.study.feasible import feasible_pareto
from tuner.study.storage import load_existing, open_study, storage_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    url = os.environ.get("TUNER_TEST_POSTGRES")
    if not url:
        pytest.skip("TUNER_TEST_POSTGRES is not set: run scripts/test.sh for a real PostgreSQL")
    return url


def _result(ttft: float, throughput: float, failure: str | None = None) -> TrialResult:
    spec = LaunchSpec(engine="vllm", python="py", module="vllm.entrypoints.openai.api_server", args=("--model", "m"),
                      host="127.0.0.1", port=8000, health_path="/health", served_model="m")  # fmt: skip
    metrics = {"ttft_p95_ms": ttft, "output_throughput_tok_s": throughput, "error_rate": 0.0}
    return TrialResult(Config("vllm", {"chunk_size": 512}), spec, "0.32.0", failure=failure, metrics=metrics)


def _run(study: optuna.Study, result: TrialResult) -> None:
    trial = study.ask()
    trial.suggest_categorical("engine", ["vllm"])
    study.tell(trial, record(trial, result, "pareto"))


def test_a_study_round_trips_through_the_storage(storage: str) -> None:
    name = f"s-{uuid.uuid4().hex[:8]}"
    study = open_study(name, storage, DIRECTIONS, make_sampler("tpe", 0))
    bind_study_attrs(study, {"workload": "rag", "workload_digest": "a" * 64})
    enqueue_defaults(study, ["vllm"])
    enqueue_defaults(study, ["vllm"])  # a resumed search must not enqueue the default twice
    _run(study, _result(100.0, 50.0))
    _run(study, _result(80.0, 40.0))
    _run(study, _result(120.0, 45.0))  # dominated by the first
    _run(study, _result(1.0, 1000.0, failure="oom_boot"))
    again = load_existing(name, storage)
    trials = again.get_trials()
    assert len(trials) == 4
    assert trials[0].user_attrs["config_kind"] == "engine_default"
    assert trials[3].values == [math.inf, 0.0] and trials[3].user_attrs["failure"] == "oom_boot"
    assert [t.number for t in feasible_pareto(again)] == [0, 1]
    assert "oom_boot" in trials_table(again)
    with pytest.raises(ConfigError, match="workload"):
        bind_study_attrs(again, {"workload": "rag", "workload_digest": "b" * 64})


def test_the_cli_reads_the_storage_from_the_environment(storage: str) -> None:
    name = f"env-{uuid.uuid4().hex[:8]}"
    _run(open_study(name, storage, DIRECTIONS, make_sampler("tpe", 0)), _result(10.0, 5.0))
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "trials", "--study", name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "TUNER_STORAGE": storage},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("0*")


def test_the_default_storage_is_sqlite_under_studies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TUNER_STORAGE", raising=False)
    assert storage_url("rag", None) == "sqlite:///studies/rag.db"
    assert (tmp_path / "studies").is_dir()
    monkeypatch.setenv("TUNER_STORAGE", "sqlite:///elsewhere.db")
    assert storage_url("rag", None) == "sqlite:///elsewhere.db"
    assert storage_url("rag", "sqlite:///flag.db") == "sqlite:///flag.db"


def test_a_study_made_for_other_objectives_is_refused_before_any_trial(storage: str) -> None:
    """Made outside the tuner with two directions, resumed with the one-value capacity objective:
    Optuna loads it anyway, and every trial would fail on its value count."""
    name = f"directions-{uuid.uuid4().hex[:8]}"
    optuna.create_study(study_name=name, storage=storage, directions=["minimize", "maximize"])
    with pytest.raises(ConfigError, match=r"has the objectives \(minimize, maximize\).*needs \(maximize\)"):
        open_study(name, storage, [optuna.study.StudyDirection.MAXIMIZE], make_sampler("tpe", 0))
    assert optuna.load_study(study_name=name, storage=storage).trials == []
    assert open_study(name, storage, DIRECTIONS, make_sampler("tpe", 0)).study_name == name
