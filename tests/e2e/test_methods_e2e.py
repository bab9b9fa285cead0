"""Speculative methods end to end on the real vLLM CPU build: one study of four boots.

Trial 0 is the engine's default config, searched alone first so that its capacity is the incumbent
of what follows. Then the study is resumed for three more boots (and no finalists), which speculate
with three methods (``SPECULATING``: the generated EAGLE-3 head, n-gram lookup, the generated draft
model), each recording its acceptance from vLLM's counters at every capacity step. A method that
cannot carry the default's capacity is pruned after two steps: they cost little more than their
boots. The study is its own module's, so a parallel test run serves it beside the search e2e's.
"""

from __future__ import annotations

import json
import re

import optuna
import pytest

from tests.e2e.conftest import search_study
from tuner.report.overrides import overrides_lines

# The module's study (four boots, each with a capacity search) is set up inside the first test's time,
# and runs while the other engine files boot (tests/scheduling.py sends them first): on two cores
# that has come close to the suite's 900 s per test, so this module gets more before a hang is called one.
pytestmark = [pytest.mark.engine(boots=4), pytest.mark.timeout(1500)]
STUDY = "methods"
BASE = {"engine": "vllm", "vllm.chunk_size": 512, "vllm.max_num_seqs": 4, "vllm.memory_fraction": 0.6}
# Three methods on the generated models, each with what it takes (tuner.search.space names)
SPECULATING = {
    "eagle3": {"vllm.spec_method": "eagle3", "vllm.num_speculative_tokens": 2, "vllm.eagle3.draft": "eagle3-head"},
    "ngram": {"vllm.spec_method": "ngram", "vllm.num_speculative_tokens": 2},
    "draft_model": {"vllm.spec_method": "draft_model", "vllm.num_speculative_tokens": 2,
                    "vllm.draft_model.draft": "draft-2l"},
}  # fmt: skip
NO_FINALISTS = ("--finalists", "0", "--repeats", "0", "--no-stress")


@pytest.fixture(scope="module")
def speculated(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    storage = f"sqlite:///{tmp_path_factory.mktemp('methods') / 'methods.db'}"
    first = search_study(STUDY, storage, 1, *NO_FINALISTS)  # the engine default alone: the incumbent
    assert first.returncode == 0, first.stderr[-3000:]
    study = optuna.load_study(study_name=STUDY, storage=storage)
    for params in SPECULATING.values():
        study.enqueue_trial({**BASE, **params}, user_attrs={"config_kind": "sampled"})
    more = search_study(STUDY, storage, 1 + len(SPECULATING), *NO_FINALISTS)
    assert more.returncode == 0, more.stderr[-3000:]
    # the generated target ships no MTP layers, and this environment has no arctic-inference
    assert "vllm 0.32.0: MTP left out of its space" in more.stderr, more.stderr[:2000]
    assert "vllm 0.32.0: suffix decoding left out of its space: its environment lacks arctic_inference" in more.stderr
    return optuna.load_study(study_name=STUDY, storage=storage)


def test_each_method_booted_and_its_acceptance_is_recorded_at_every_step(speculated: optuna.Study) -> None:
    """Three methods really ran on the vLLM CPU build (one a generated EAGLE-3 head), each read back
    through vLLM's own counters: the trial's acceptance, and every capacity step's. A method that
    cannot carry the default's capacity is pruned, and recorded all the same."""
    trials = speculated.get_trials()
    assert trials[0].user_attrs["config_kind"] == "engine_default" and trials[0].user_attrs["failure"] is None
    by_method = {t.user_attrs["speculation"]["method"]: t for t in trials[1:]}
    assert set(by_method) == set(SPECULATING), "the methods the CPU build booted"
    said = []
    for method, trial in by_method.items():
        attrs, spec = trial.user_attrs, trial.user_attrs["speculation"]
        assert attrs["failure"] is None and attrs["booted"], (method, attrs["failure"], attrs["log_tail"][-2000:])
        assert trial.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED), trial.state
        config = json.loads(_spec_config(attrs["launch"]["args"]))
        assert config["method"] == method and config["num_speculative_tokens"] == 2 == spec["num_speculative_tokens"]
        # vLLM counts drafts whatever the method (a step where n-gram lookup found no match proposes none)
        counted = [step for step in spec["steps"] if step["acceptance_rate"] is not None]
        assert counted, (method, spec)
        for step in counted:
            assert 0.0 <= step["acceptance_rate"] <= 1.0 and 1.0 <= step["mean_accept_len"] <= 3.0, (method, step)
        # the claim's step is among those served (a served step's counters are stored to 4 decimals)
        served = [step["acceptance_rate"] for step in spec["steps"]]
        assert any(_same(spec["acceptance_rate"], rate) for rate in served), (spec["acceptance_rate"], served)
        said.append(f"{method} ({spec['draft'] or 'no model'}): acceptance {spec['acceptance_rate']}, "
                    f"mean accepted length {spec['mean_accept_len']}")  # fmt: skip
    # the agreeing draft is right more often than a random head (near zero by construction)
    accepted = {method: t.user_attrs["speculation"]["acceptance_rate"] or 0.0 for method, t in by_method.items()}
    assert accepted["draft_model"] > accepted["eagle3"], said
    print("booted on the vLLM CPU build: " + "; ".join(said))


def test_each_trial_records_what_vllm_changed_of_its_config(speculated: optuna.Study) -> None:
    """Read off each real boot's log by the adapter (``config_overrides``): the CPU build runs every
    config on the V1 model runner, and with speculation vLLM caps the tokens a step schedules, which it
    does not for the defaults; the report lists each change once."""
    trials = speculated.get_trials()
    by_method = {t.user_attrs["speculation"]["method"]: t for t in trials[1:]}
    runner = "the V1 model runner (V2 requires Triton)"
    for trial in trials:
        assert runner in trial.user_attrs["engine_overrides"], (trial.number, trial.user_attrs["engine_overrides"])
    drafting = re.compile(r"at most \d+ tokens scheduled a step \(set for speculative decoding\)")
    assert any(drafting.fullmatch(c) for c in by_method["draft_model"].user_attrs["engine_overrides"])
    assert not any(drafting.fullmatch(c) for c in trials[0].user_attrs["engine_overrides"]), "the defaults"
    assert f"vllm changed the config: {runner} (trials {', '.join(str(t.number) for t in trials)})" in (
        overrides_lines(speculated)
    )


def test_the_default_sampler_predicted_each_trial_before_it_booted(speculated: optuna.Study) -> None:
    """The study names no ``--sampler``, so under capacity it runs the performance model
    (``default_sampler``): each enqueued trial's prediction is stored before it boots. The engine
    default, first, has nothing to be fitted on; each method after it is fitted on what served before."""
    trials = speculated.get_trials()
    first = trials[0].user_attrs["predicted"]
    assert first["fitted_on"] == 0 and first["tiers"], first
    assert all(tier["capacity_req_s"] is None for tier in first["tiers"].values()), first
    said = {}
    for trial in trials[1:]:
        predicted = trial.user_attrs["predicted"]
        assert predicted["fitted_on"] >= 1 and set(predicted["tiers"]) == set(first["tiers"]), predicted
        for tier in predicted["tiers"].values():
            low, high = tier["low_req_s"], tier["high_req_s"]
            assert low is None or high is None or 0.0 <= low <= high, tier
            assert isinstance(tier["basis"], str) and tier["basis"], tier
        said[trial.user_attrs["speculation"]["method"]] = predicted["tiers"]
    assert any(t["high_req_s"] for tiers in said.values() for t in tiers.values()), said


def _same(claimed: float | None, served: float | None) -> bool:
    return claimed == served if claimed is None or served is None else abs(claimed - served) < 1e-4


def _spec_config(args: list[str]) -> str:
    return args[args.index("--speculative-config") + 1]
