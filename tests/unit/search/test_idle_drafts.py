"""A draft measured accepting next to nothing is not booted again on the same engine: the rule on the H100
study's real trials (reports/gpu-h100.md: the generated EAGLE-3 head accepted nothing on either engine),
and through the search objective, which tells such a config pruned without a boot."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import optuna

from tests.unit.search.test_objective import ScriptedEngine, _study
from tests.unit.search.test_objective import ctx as ctx  # noqa: F401  (a fixture)
from tests.unit.study_files import H100_STUDY
from tuner.engines.base import Config, ModelSpec
from tuner.measure.trial import TrialContext, TrialResult, WatchFactory
from tuner.report.trials_table import search_effort, trial_rows
from tuner.search.acceptance import IDLE_GAIN_PER_STEP, idle_draft_like, measured_gain
from tuner.search.objective import SearchObjective
from tuner.search.space import Space


@functools.cache
def _h100() -> dict[int, optuna.trial.FrozenTrial]:
    """The H100 study's trials, read once for the module (the tests only read them)."""
    study = optuna.load_study(study_name="rag-h100-study-1", storage=f"sqlite:///{H100_STUDY}")
    return {t.number: t for t in study.trials}


def test_the_h100_heads_and_drafts_are_told_apart_by_what_they_measured() -> None:
    trials = _h100()
    measured = {n: measured_gain(trials[n].user_attrs.get("speculation")) for n in (2, 3, 9, 12, 13)}
    assert measured[9] is None  # died at boot: measured nothing
    assert measured[3] is not None and 3 * measured[3] < IDLE_GAIN_PER_STEP  # vLLM, EAGLE-3 head, K=3
    assert measured[13] is not None and 6 * measured[13] < IDLE_GAIN_PER_STEP  # SGLang, the same head, K=1
    assert measured[2] is not None and measured[2] > 1  # draft-2l, K=3
    assert measured[12] is not None and measured[12] > IDLE_GAIN_PER_STEP  # draft-1l, K=2: little, not nothing


def test_trial_10_would_have_been_told_from_trial_3_and_trial_13_would_not() -> None:
    """Trial 10 (vLLM, the EAGLE-3 head, K=3, died at boot) speculated with trial 3's head on trial 3's
    engine; trial 13 ran the head on SGLang, whose drafting trial 3 says nothing of."""
    trials = _h100()
    ran = [trials[n] for n in range(10)]
    told = idle_draft_like(Config("vllm", dict(trials[10].user_attrs["config"])), ran)
    assert told is not None and told[0].number == 3
    assert idle_draft_like(Config("sglang", dict(trials[13].user_attrs["config"])), [*ran, trials[10]]) is None
    assert idle_draft_like(Config("vllm", dict(trials[7].user_attrs["config"])), ran) is None  # draft-2l served


def test_trial_18_which_the_tag_booted_would_have_been_told_from_trial_3() -> None:
    """Block 10 booted vLLM with the EAGLE-3 head at K=1 (trial 18) and measured it accepting nothing again,
    as trial 3 had at K=3 (reports/gpu-h100/study-1/block10/NOTES.md); main would not have booted it."""
    trials = _h100()
    gain = measured_gain(trials[18].user_attrs.get("speculation"))
    assert gain is not None and gain < IDLE_GAIN_PER_STEP  # it did accept next to nothing
    ran = [trials[n] for n in range(18)]
    told = idle_draft_like(Config("vllm", dict(trials[18].user_attrs["config"])), ran)
    assert told is not None and told[0].number == 3


def test_trial_19_was_told_from_nothing_before_it_and_its_own_measurement_tells_only_its_width() -> None:
    """Block 11 booted SGLang with the EAGLE head in a 4-wide tree (trial 19), which accepted next to
    nothing (reports/gpu-h100/study-1/block11/NOTES.md). No earlier trial had measured that head on
    SGLang (trial 9 ran it on vLLM and died at boot), so main would have booted it too; now its
    measurement tells the same head on SGLang in a tree of that width, and not in a chain."""
    trials = _h100()
    config = dict(trials[19].user_attrs["config"])
    assert (config["draft_model"], config["spec_tree"]) == ("eagle-head", [4, 8])
    gain = measured_gain(trials[19].user_attrs.get("speculation"))
    assert gain is not None and config["num_speculative_tokens"] * gain < IDLE_GAIN_PER_STEP
    assert measured_gain(trials[9].user_attrs.get("speculation")) is None
    assert idle_draft_like(Config("sglang", config), [trials[n] for n in range(19)]) is None
    told = idle_draft_like(Config("sglang", {**config, "num_speculative_tokens": 2}), [trials[19]])
    assert told is not None and told[0].number == 19
    assert idle_draft_like(Config("sglang", {**config, "spec_tree": [1, 2]}), [trials[19]]) is None
    assert idle_draft_like(Config("vllm", {k: v for k, v in config.items() if k != "spec_tree"}), [trials[19]]) is None


def test_the_same_engine_and_head_in_a_chain_is_told_and_a_wider_tree_is_not() -> None:
    trials = _h100()
    head = dict(trials[13].user_attrs["config"])  # SGLang EAGLE-3 head, tree [1, 2]: a chain
    for k, tree in ((1, [1, 2]), (3, [1, 4]), (6, None)):
        params = {**head, "num_speculative_tokens": k, "spec_tree": tree}
        told = idle_draft_like(Config("sglang", {p: v for p, v in params.items() if v is not None}), [trials[13]])
        assert told is not None and told[0].number == 13, (k, tree)
    assert idle_draft_like(Config("sglang", {**head, "spec_tree": [2, 4]}), [trials[13]]) is None
    assert idle_draft_like(Config("sglang", {**head, "draft_model": "eagle3-other"}), [trials[13]]) is None
    assert idle_draft_like(Config("sglang", {**head, "num_speculative_tokens": 0}), [trials[13]]) is None


def test_a_larger_k_is_told_only_while_k_times_the_gain_stays_under_the_floor() -> None:
    trial3 = _h100()[3]
    gain = measured_gain(trial3.user_attrs["speculation"])
    assert gain is not None and gain > 0
    largest = int(IDLE_GAIN_PER_STEP / gain)
    config = dict(trial3.user_attrs["config"])
    assert idle_draft_like(Config("vllm", {**config, "num_speculative_tokens": largest}), [trial3]) is not None
    assert idle_draft_like(Config("vllm", {**config, "num_speculative_tokens": largest + 1}), [trial3]) is None


class IdleHeadEngine(ScriptedEngine):
    """The scripted CPU build, whose server's counters say the head accepts nothing and the draft most."""

    def __call__(
        self, number: int, config: Config, trial_ctx: TrialContext, watch: WatchFactory | None = None
    ) -> TrialResult:
        result = super().__call__(number, config, trial_ctx, watch)
        if config.params.get("num_speculative_tokens"):
            accepted = 1.0 if config.params.get("draft_model") == "eagle3-head" else 2.5
            result.server = {"spec_mean_accept_len": accepted, "spec_acceptance_rate": (accepted - 1) / 3}
        return result


def test_the_search_tells_a_config_with_an_idle_head_pruned_without_a_boot(ctx: TrialContext) -> None:  # noqa: F811
    study, engine = _study(), IdleHeadEngine()
    drafts = {name: ctx.model.path + "/" + name for name in ("draft-2l", "eagle3-head")}
    kinds = {"eagle3-head": "eagle3"}
    ctx = dataclasses.replace(ctx, model=ModelSpec(ctx.model.path, drafts=drafts, draft_kinds=kinds))
    space = Space.model_validate({"engines": ["vllm"], "parameters": {
        "memory_fraction": {"choices": [0.9]}, "chunk_size": {"choices": [1024, 2048]},
        "spec_method": {"choices": ["eagle3", "draft_model"]}, "num_speculative_tokens": {"choices": [1, 3]},
        "draft_model": {"choices": ["draft-2l", "eagle3-head"]}}})  # fmt: skip
    fixed: dict[str, Any] = {"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.num_speculative_tokens": 3}
    head = {**fixed, "vllm.spec_method": "eagle3", "vllm.draft_model": "eagle3-head"}
    draft = {**fixed, "vllm.spec_method": "draft_model", "vllm.draft_model": "draft-2l"}
    for params in ({**head, "vllm.chunk_size": 2048}, {**head, "vllm.chunk_size": 1024},
                   {**draft, "vllm.chunk_size": 2048}, {**draft, "vllm.chunk_size": 1024}):  # fmt: skip
        study.enqueue_trial(params)
    objective = SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False)
    study.optimize(objective, n_trials=4)
    first, second, third, fourth = study.trials
    assert first.state == optuna.trial.TrialState.COMPLETE and first.user_attrs["booted"] is True
    assert second.state == optuna.trial.TrialState.PRUNED
    assert second.user_attrs["booted"] is False and second.user_attrs["idle_draft_like"] == 0
    assert second.user_attrs["config"]["chunk_size"] == 1024 and "launch" in second.user_attrs
    assert third.user_attrs["booted"] is True and fourth.user_attrs["booted"] is True  # the draft accepts
    assert [p["chunk_size"] for p in engine.booted] == [2048, 2048, 1024] and objective.boots == 3
    assert "1 whose draft an earlier trial measured accepting next to nothing" in search_effort(study)
    assert any(row[0] == "1" and row[2] == "idle draft, as trial 0" for row in trial_rows(study))


def test_no_screen_boots_it_all_the_same(ctx: TrialContext) -> None:  # noqa: F811
    study, engine = _study(), IdleHeadEngine()
    head = ModelSpec(
        ctx.model.path, drafts={"eagle3-head": ctx.model.path + "/h"}, draft_kinds={"eagle3-head": "eagle3"}
    )
    ctx = dataclasses.replace(ctx, model=head)
    space = Space.model_validate({"engines": ["vllm"], "parameters": {
        "memory_fraction": {"choices": [0.9]}, "chunk_size": {"choices": [1024, 2048]},
        "spec_method": {"choices": ["eagle3"]}, "num_speculative_tokens": {"choices": [3]},
        "draft_model": {"choices": ["eagle3-head"]}}})  # fmt: skip
    for chunk in (2048, 1024):
        study.enqueue_trial({"engine": "vllm", "vllm.memory_fraction": 0.9, "vllm.chunk_size": chunk,
                             "vllm.spec_method": "eagle3", "vllm.num_speculative_tokens": 3,
                             "vllm.draft_model": "eagle3-head"})  # fmt: skip
    objective = SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False, screen=False)
    study.optimize(objective, n_trials=2)
    assert objective.boots == 2 and all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
