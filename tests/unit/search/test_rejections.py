"""A config the engine rejected for its draft slots teaches the search which others it will reject:
the rule on its own, on the H200 study's real rejected trial, and through the search objective; and
a config the adapter knows the engine's validation refuses is recorded alike before any boot."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from tests.unit.search.test_objective import ScriptedEngine, _study
from tests.unit.search.test_objective import ctx as ctx  # noqa: F401  (a fixture)
from tests.unit.study_files import H200_CAPACITY_BLOCK4, H200_FIRST
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter
from tuner.measure.failures import classify_boot
from tuner.measure.trial import TrialContext, TrialResult, WatchFactory
from tuner.report.trials_table import search_effort
from tuner.search.objective import SearchObjective
from tuner.search.rejections import no_easier, rejected_like
from tuner.search.space import Space

REJECTED = {"chunk_size": 512, "num_speculative_tokens": 2, "draft_model": "draft-2l", "memory_fraction": 0.9}
VLLM = VllmAdapter()


@pytest.mark.parametrize(
    ("change", "rejected"),
    [
        ({}, True),
        ({"num_speculative_tokens": 4}, True),
        ({"num_speculative_tokens": 1}, True),  # a draft model takes one slot per request whatever K
        ({"draft_model": "draft-1l"}, True),  # ... and whichever draft
        ({"chunk_size": 256, "memory_fraction": 0.7}, True),  # memory plays no part
        ({"chunk_size": 1024}, False),
        ({"draft_model": "ngram"}, False),  # n-gram lookup takes no slot
        ({"num_speculative_tokens": 0}, False),
        ({"max_num_seqs": 64}, False),  # the rejected one ran the default: not comparable
    ],
)
def test_no_easier_on_batched_tokens_draft_slots_and_sequences(change: dict[str, object], rejected: bool) -> None:
    assert no_easier({**REJECTED, **change}, REJECTED, VLLM) is rejected


@pytest.mark.parametrize(
    ("change", "rejected"),
    [({}, True), ({"num_speculative_tokens": 4}, True), ({"num_speculative_tokens": 1}, False),
     ({"draft_model": "draft-1l"}, False), ({"chunk_size": 1024}, False)],
)  # fmt: skip
def test_where_the_engine_does_not_say_its_slots_only_the_same_draft_with_more_tokens_is_no_easier(
    change: dict[str, object], rejected: bool
) -> None:
    assert SglangAdapter().draft_slots(REJECTED) is None
    assert no_easier({**REJECTED, **change}, REJECTED, SglangAdapter()) is rejected


def _gpu_trial(number: int) -> optuna.trial.FrozenTrial:
    return optuna.load_study(study_name="rag-h200", storage=f"sqlite:///{H200_FIRST}").trials[number]


def test_the_h200_rejection_is_generalised_and_nothing_else() -> None:
    """Trial 13 of the H200 study: vLLM 0.26 rejected chunk 512 with draft-2l at K = 2."""
    trial = _gpu_trial(13)
    assert trial.user_attrs["failure"] == "invalid_config"
    assert classify_boot(trial.user_attrs["log_tail"], 1, False, VllmAdapter()) == "invalid_config"
    harder = Config("vllm", {**trial.user_attrs["config"], "num_speculative_tokens": 5})
    assert rejected_like(harder, [trial], VLLM) is trial
    easier = Config("vllm", {**trial.user_attrs["config"], "chunk_size": 2048})
    assert rejected_like(easier, [trial], VLLM) is None
    assert rejected_like(Config("sglang", dict(harder.params)), [trial], SglangAdapter()) is None
    served = _gpu_trial(9)  # a served trial is never evidence
    assert rejected_like(Config("vllm", {**served.user_attrs["config"]}), [served], VLLM) is None


def test_a_rejection_for_another_cause_is_not_generalised_by_the_draft_slot_warning() -> None:
    """vLLM warns with the same words and a positive count on a server that boots; only the refusal's 0 counts."""
    warned = optuna.trial.create_trial(value=0.0, user_attrs={
        "failure": "invalid_config", "engine": "vllm", "config": REJECTED,
        "log_tail": "WARNING max_num_scheduled_tokens is set to 1024 based on the speculative decoding settings. "
                    "This may lead to suboptimal performance.\nerror: unrecognized arguments: --bogus"})  # fmt: skip
    assert rejected_like(Config("vllm", dict(REJECTED)), [warned], VLLM) is None
    refused = optuna.trial.create_trial(value=0.0, user_attrs={**warned.user_attrs, "log_tail": (
        "ValueError: max_num_scheduled_tokens is set to 0 based on the speculative decoding settings")})  # fmt: skip
    assert rejected_like(Config("vllm", dict(REJECTED)), [refused], VLLM) is refused
    newer = optuna.trial.create_trial(value=0.0, user_attrs={**warned.user_attrs, "log_tail": (
        "Value error, VllmConfig does not have enough slots to schedule a token and support the "
        "speculative decoding settings.")})  # fmt: skip  # 0.32's words for the same refusal
    assert rejected_like(Config("vllm", dict(REJECTED)), [newer], VLLM) is newer
    assert classify_boot(newer.user_attrs["log_tail"], 1, False, VLLM) == "invalid_config"


def test_block4s_rejections_would_have_been_told_from_the_first() -> None:
    """H200 block 4: vLLM 0.26 rejected trial 1 (chunk 1024, draft-2l, K = 2), then booted trials 5-7
    (chunk 512 or 1024, K = 1 or 3, either draft) only to be refused alike; the spec configs at chunk
    2048 served."""
    trials = optuna.load_study(study_name="rag-h200-capacity-4", storage=f"sqlite:///{H200_CAPACITY_BLOCK4}").trials
    first = trials[1]
    assert first.user_attrs["failure"] == "invalid_config"
    for t in trials[2:]:
        config = Config("vllm", dict(t.user_attrs["config"]))
        told = rejected_like(config, [first], VLLM)
        assert (told is first) is (t.user_attrs["failure"] == "invalid_config"), t.number
    assert {t.number for t in trials if t.user_attrs["failure"] == "invalid_config"} == {1, 5, 6, 7}


class RejectingEngine(ScriptedEngine):
    """vLLM as on the H200: chunk 512 with K >= 2 fails its config validation at engine start."""

    def __call__(
        self, number: int, config: Config, trial_ctx: TrialContext, watch: WatchFactory | None = None
    ) -> TrialResult:
        if config.params.get("chunk_size") == 512 and int(config.params.get("num_speculative_tokens", 0)) >= 2:
            result = super().__call__(number, Config("vllm", {"memory_fraction": 0.9}), trial_ctx)  # counts the boot
            result.config, result.failure, result.metrics = config, "invalid_config", {}
            result.log_tail = ("ValueError: max_num_scheduled_tokens is set to 0 based on the speculative decoding "
                               "settings, which does not allow any tokens to be scheduled.")  # fmt: skip
            return result
        return super().__call__(number, config, trial_ctx, watch)


def test_the_search_records_a_config_no_easier_than_a_rejected_one_without_a_boot(
    ctx: TrialContext,  # noqa: F811
) -> None:
    study, engine = _study(), RejectingEngine()
    # the draft the space names must be the model's (its folder need not exist: no engine boots)
    ctx = dataclasses.replace(ctx, model=ModelSpec(ctx.model.path, drafts={"draft-2l": ctx.model.path + "/draft-2l"}))
    space = Space.model_validate({"engines": ["vllm"], "parameters": {
        "memory_fraction": {"choices": [0.9]}, "chunk_size": {"choices": [512, 2048]},
        "num_speculative_tokens": {"choices": [0, 2, 4]}, "draft_model": {"choices": ["draft-2l"]}}})  # fmt: skip
    fixed = {"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.draft_model": "draft-2l"}
    study.enqueue_trial({**fixed, "vllm.chunk_size": 512, "vllm.num_speculative_tokens": 2})
    study.enqueue_trial({**fixed, "vllm.chunk_size": 512, "vllm.num_speculative_tokens": 4})
    study.enqueue_trial({**fixed, "vllm.chunk_size": 2048, "vllm.num_speculative_tokens": 4})
    objective = SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False)
    study.optimize(objective, n_trials=3)
    first, second, third = study.trials
    assert first.user_attrs["failure"] == "invalid_config" and first.user_attrs["booted"] is True
    assert second.user_attrs["failure"] == "invalid_config" and second.user_attrs["rejected_like"] == 0
    assert second.user_attrs["booted"] is False and second.user_attrs["constraint_violation"] > 0
    assert third.user_attrs["failure"] is None and third.user_attrs["booted"] is True
    assert len(engine.booted) == 2 and objective.boots == 2
    assert search_effort(study).startswith("3 trials: 2 booted an engine")


H200 = Device("cuda", "NVIDIA H200", 150_754_820_096)


@pytest.mark.parametrize(("version", "refused"), [("0.26.0", True), ("0.32.0", False)])
def test_a_config_the_engines_own_validation_refuses_is_recorded_without_a_boot(
    ctx: TrialContext,  # noqa: F811
    version: str,
    refused: bool,
) -> None:
    """On the H200, vLLM 0.26 refuses a draft model at chunk 1024 (its 1024 default sequences take
    every batched token): told from the adapter's rule, with nothing learned yet; 0.32 runs it."""
    study, engine = _study(), ScriptedEngine()
    env = dataclasses.replace(ctx.engines["vllm"][1], version=version)
    ctx = dataclasses.replace(
        ctx, device=H200, engines={"vllm": (VLLM, env)},
        model=ModelSpec(ctx.model.path, drafts={"draft-1l": ctx.model.path + "/draft-1l"}),
    )  # fmt: skip
    space = Space.model_validate({"engines": ["vllm"], "parameters": {
        "memory_fraction": {"choices": [0.9]}, "chunk_size": {"choices": [1024, 2048]},
        "num_speculative_tokens": {"choices": [2]}, "draft_model": {"choices": ["draft-1l"]}}})  # fmt: skip
    fixed = {"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.draft_model": "draft-1l",
             "vllm.num_speculative_tokens": 2}  # fmt: skip
    study.enqueue_trial({**fixed, "vllm.chunk_size": 1024})
    study.enqueue_trial({**fixed, "vllm.chunk_size": 2048})
    objective = SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False)
    study.optimize(objective, n_trials=2)
    small, large = study.trials
    assert large.user_attrs["failure"] is None and large.user_attrs["booted"] is True
    if not refused:
        assert small.user_attrs["booted"] is True and "refused" not in small.user_attrs
        assert len(engine.booted) == 2
        return
    assert small.user_attrs["failure"] == "invalid_config" and small.user_attrs["booted"] is False
    assert "leaving none to schedule" in small.user_attrs["refused"]
    assert "rejected_like" not in small.user_attrs and small.user_attrs["constraint_violation"] > 0
    assert small.user_attrs["launch"]["args"][-1].startswith("{"), "the argv it would have run is stored"
    assert engine.booted == [dict(large.user_attrs["config"])] and objective.boots == 1
