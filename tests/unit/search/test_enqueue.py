"""A space's ``enqueue:`` configs: checked at load (one line per problem), queued once per study right
after the engine defaults, left out with a line where this run cannot boot them, screened as sampled."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from tests.unit.search.offers import model_of, offers
from tests.unit.search.test_objective import ScriptedEngine, tiny_context
from tuner.errors import ConfigError
from tuner.measure.trial import TrialContext
from tuner.search.enqueue import enqueued_points
from tuner.search.objective import SearchObjective
from tuner.search.scoring import DIRECTIONS
from tuner.search.space import Space, load_space
from tuner.study.attrs import DEFAULT_KIND, ENQUEUED_KIND, SAMPLED_KIND, enqueue_configs, enqueue_defaults

REPO = Path(__file__).resolve().parents[3]
SPECULATING = """\
engines: [vllm, sglang]
parameters:
  chunk_size: {choices: [1024, 2048]}
  memory_fraction: {low: 0.70, high: 0.95, step: 0.05}
  spec_method: {choices: [off, draft_model, eagle3, ngram]}
  num_speculative_tokens: {low: 1, high: 4}
  draft_model: {choices: [draft-2l, eagle3-head]}
  ngram_lookup: {choices: [[1, 3]]}
  spec_schedule: {choices: {static: null}}
  spec_tree: {choices: [[1, 2], [4, 8]]}
"""
DRAFT = "{engine: vllm, chunk_size: 2048, memory_fraction: 0.9, spec_method: draft_model, draft_model: draft-2l, "
STATIC_DRAFT = DRAFT + "num_speculative_tokens: 3, spec_schedule: static}"
OFF_1024 = "{engine: vllm, chunk_size: 1024, memory_fraction: 0.9, spec_method: off}"
SGLANG_DRAFT = ("{engine: sglang, chunk_size: 2048, memory_fraction: 0.9, spec_method: draft_model, "
                "draft_model: draft-2l, num_speculative_tokens: 3, spec_tree: [1, 2]}")  # fmt: skip


def _space(tmp_path: Path, *entries: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(SPECULATING + "enqueue:\n" + "".join(f"  - {e}\n" for e in entries))
    return path


# --- the key, checked at load --------------------------------------------------------------------


def test_the_gpu_space_enqueues_the_static_draft_the_eagle3_head_the_small_chunk_and_sglangs_draft() -> None:
    space = load_space(REPO / "search_spaces" / "gpu-h200.yaml")
    entries = [(e.engine, e.params.get("spec_method"), e.params["chunk_size"]) for e in space.enqueue]
    assert entries == [("vllm", "draft_model", 2048), ("vllm", "eagle3", 2048), ("vllm", "off", 1024),
                       ("sglang", "draft_model", 2048)]  # fmt: skip
    assert space.enqueue[0].params == {"chunk_size": 2048, "memory_fraction": 0.9, "spec_method": "draft_model",
                                       "draft_model": "draft-2l", "num_speculative_tokens": 3,
                                       "spec_schedule": "static"}  # fmt: skip
    assert space.enqueue[3].params["spec_tree"] == [1, 2], "a chain: SGLang's static K"


def test_a_bare_off_reads_as_the_method(tmp_path: Path) -> None:
    space = load_space(_space(tmp_path, OFF_1024, STATIC_DRAFT, SGLANG_DRAFT))
    assert space.enqueue[0].params["spec_method"] == "off"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("{engine: vllm, chunk_size: 1024, memory_fraction: 0.9, spec_method: off, flash: 1}",
         "enqueue.0 (vllm): unknown parameter 'flash'"),
        ("{engine: vllm, chunk_size: 512, memory_fraction: 0.9, spec_method: off}",
         "enqueue.0 (vllm): chunk_size 512 is outside the space's choices [1024, 2048]"),
        ("{engine: vllm, chunk_size: 1024, memory_fraction: 0.93, spec_method: off}",
         "enqueue.0 (vllm): memory_fraction 0.93 is outside the space's range 0.7..0.95 step 0.05"),
        (DRAFT + "num_speculative_tokens: 5, spec_schedule: static}",
         "enqueue.0 (vllm): num_speculative_tokens 5 is outside the space's range 1..4"),
        (DRAFT + "num_speculative_tokens: 3, spec_schedule: taper}",
         "enqueue.0 (vllm): spec_schedule 'taper' is outside the space's choices [static]"),
        ("{engine: vllm, chunk_size: 1024, memory_fraction: 0.9, spec_method: mtp}",
         "enqueue.0 (vllm): spec_method 'mtp' is outside the space's methods [off, draft_model, eagle3, ngram]"),
        ("{engine: tensorrt, chunk_size: 1024}", "enqueue.0 (tensorrt): engine 'tensorrt' is not among the space's"),
        ("{engine: vllm, chunk_size: 1024, memory_fraction: 0.9, spec_method: off, num_speculative_tokens: 3}",
         "enqueue.0 (vllm): num_speculative_tokens is not used by spec_method off on vllm"),
        (DRAFT + "num_speculative_tokens: 3, spec_schedule: static, spec_tree: [1, 2]}",
         "enqueue.0 (vllm): spec_tree is not used by spec_method draft_model on vllm"),
        ("{engine: vllm, chunk_size: 1024, memory_fraction: 0.9, max_num_seqs: 8, spec_method: off}",
         "enqueue.0 (vllm): max_num_seqs is not tuned by this space"),
        (DRAFT + "spec_schedule: static}", "enqueue.0 (vllm): give num_speculative_tokens"),
        ("{engine: vllm, chunk_size: 1024, memory_fraction: 0.9, spec_method: ngram, num_speculative_tokens: 2, "
         "spec_schedule: static}", "enqueue.0 (vllm): give ngram_lookup"),
        ("{engine: sglang, chunk_size: 1024, memory_fraction: 0.9, spec_method: ngram, num_speculative_tokens: 2, "
         "spec_tree: [1, 2]}", "enqueue.0 (sglang): spec_tree is not used by spec_method ngram on sglang"),
        ("{chunk_size: 1024}", "enqueue.0: each entry is a mapping that names its engine"),
    ],
)  # fmt: skip
def test_each_wrong_entry_is_one_line_naming_the_entry_and_what_is_wrong(tmp_path: Path, entry: str, says: str) -> None:
    path = _space(tmp_path, entry)
    with pytest.raises(ConfigError) as info:
        load_space(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    assert says in message, message


def test_an_entry_listed_twice_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"enqueue\.1 \(vllm\): the same config as enqueue\.0"):
        load_space(_space(tmp_path, OFF_1024, OFF_1024))


# --- what this run can boot ----------------------------------------------------------------------

HEADS = model_of(["draft-2l", "eagle3-head"], {"eagle3-head": "eagle3"})


def test_entries_become_the_params_the_sampler_would_draw(tmp_path: Path) -> None:
    space = load_space(_space(tmp_path, STATIC_DRAFT, OFF_1024, SGLANG_DRAFT))
    points, notes = enqueued_points(space, offers(space, model=HEADS))
    assert notes == []
    assert points == [
        {"engine": "vllm", "vllm.chunk_size": 2048, "vllm.memory_fraction": 0.9, "vllm.spec_method": "draft_model",
         "vllm.draft_model.draft": "draft-2l", "vllm.num_speculative_tokens": 3, "vllm.spec_schedule": "static"},
        {"engine": "vllm", "vllm.chunk_size": 1024, "vllm.memory_fraction": 0.9, "vllm.spec_method": "off"},
        {"engine": "sglang", "sglang.chunk_size": 2048, "sglang.memory_fraction": 0.9,
         "sglang.spec_method": "draft_model", "sglang.draft_model.draft": "draft-2l",
         "sglang.num_speculative_tokens": 3, "sglang.spec_tree": "1x2"},
    ]  # fmt: skip


def test_an_engine_or_a_method_not_run_here_leaves_its_entries_out_with_one_line_each(tmp_path: Path) -> None:
    space = load_space(_space(tmp_path, STATIC_DRAFT, OFF_1024, SGLANG_DRAFT))
    points, notes = enqueued_points(space, offers(space, ["sglang"], model=HEADS))
    assert [p["engine"] for p in points] == ["sglang"]
    assert notes == [f"enqueue.{i} (vllm): left out: vllm is not among this run's engines" for i in (0, 1)]
    raw = yaml.safe_load(_space(tmp_path, STATIC_DRAFT, OFF_1024).read_text())
    del raw["parameters"]["draft_model"]  # every draft the model has: here none, so the method is left out
    space = Space.model_validate(raw)
    points, notes = enqueued_points(space, offers(space, ["vllm"], model=model_of([])))
    assert [p["vllm.spec_method"] for p in points] == ["off"]
    assert notes == ["enqueue.0 (vllm): left out: draft model is left out of vllm's space here"]


def test_a_draft_that_does_not_serve_the_entrys_method_is_bad_input(tmp_path: Path) -> None:
    head_as_draft = DRAFT.replace("draft-2l", "eagle3-head") + "num_speculative_tokens: 3, spec_schedule: static}"
    space = load_space(_space(tmp_path, head_as_draft))
    with pytest.raises(ConfigError, match=r"enqueue\.0 \(vllm\): draft_model 'eagle3-head' does not serve draft"):
        enqueued_points(space, offers(space, ["vllm"], model=HEADS))


# --- in a study ----------------------------------------------------------------------------------


@pytest.fixture
def ctx(tmp_path: Path) -> TrialContext:
    return tiny_context(tmp_path)


def _cpu_space(*entries: dict[str, object]) -> Space:
    return Space.model_validate({"engines": ["vllm"], "enqueue": list(entries), "parameters": {
        "memory_fraction": {"choices": [0.1, 0.2, 0.9]}, "chunk_size": {"choices": [512, 1024, 2048]}}})  # fmt: skip


def _queue(study: optuna.Study, space: Space) -> None:
    """What ``tuner search`` does under its lock at every start."""
    enqueue_defaults(study, ["vllm"])
    enqueue_configs(study, enqueued_points(space, offers(space))[0])


def test_enqueued_configs_boot_after_the_defaults_and_before_the_sampler(ctx: TrialContext) -> None:
    space = _cpu_space({"engine": "vllm", "chunk_size": 1024, "memory_fraction": 0.9},
                       {"engine": "vllm", "chunk_size": 2048, "memory_fraction": 0.9})  # fmt: skip
    study = optuna.create_study(directions=DIRECTIONS, sampler=optuna.samplers.RandomSampler(seed=3))
    _queue(study, space)
    engine = ScriptedEngine()
    study.optimize(SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False), n_trials=5)
    kinds = [t.user_attrs["config_kind"] for t in study.trials]
    assert kinds == [DEFAULT_KIND, ENQUEUED_KIND, ENQUEUED_KIND, SAMPLED_KIND, SAMPLED_KIND]
    assert engine.booted[:3] == [{}, {"chunk_size": 1024, "memory_fraction": 0.9},
                                 {"chunk_size": 2048, "memory_fraction": 0.9}]  # fmt: skip


def test_enqueued_configs_are_queued_once_across_a_resume(ctx: TrialContext, tmp_path: Path) -> None:
    space = _cpu_space({"engine": "vllm", "chunk_size": 1024, "memory_fraction": 0.9})
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=url, directions=DIRECTIONS)
    _queue(study, space)
    _queue(study, space)  # a second worker starting at the same time
    assert len(study.trials) == 2
    study.optimize(SearchObjective(study, space, ctx, "pareto", runner=ScriptedEngine(), prune=False), n_trials=2)
    resumed = optuna.load_study(study_name="s", storage=url)
    _queue(resumed, space)
    assert len(resumed.trials) == 2 and not resumed.get_trials(states=(optuna.trial.TrialState.WAITING,))
    edited = _cpu_space({"engine": "vllm", "chunk_size": 1024, "memory_fraction": 0.9},
                        {"engine": "vllm", "chunk_size": 512, "memory_fraction": 0.9})  # fmt: skip
    _queue(resumed, edited)  # an entry added to the space between runs is queued, the other not again
    waiting = resumed.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"]["vllm.chunk_size"] for t in waiting] == [512]


def test_an_interrupted_enqueued_config_is_queued_again(tmp_path: Path) -> None:
    space = _cpu_space({"engine": "vllm", "chunk_size": 1024, "memory_fraction": 0.9})
    study = optuna.create_study(directions=DIRECTIONS)
    enqueue_configs(study, enqueued_points(space, offers(space))[0])
    trial = study.ask()
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    enqueue_configs(study, enqueued_points(space, offers(space))[0])
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1


def test_enqueued_configs_go_through_the_memory_screen_as_sampled_ones_do(ctx: TrialContext) -> None:
    """0.2 runs out of memory on the scripted engine; 0.1 is then predicted not to fit and never boots."""
    space = _cpu_space({"engine": "vllm", "chunk_size": 512, "memory_fraction": 0.2},
                       {"engine": "vllm", "chunk_size": 1024, "memory_fraction": 0.1})  # fmt: skip
    study, engine = optuna.create_study(directions=DIRECTIONS), ScriptedEngine()
    enqueue_configs(study, enqueued_points(space, offers(space))[0])
    study.optimize(SearchObjective(study, space, ctx, "pareto", runner=engine, prune=False), n_trials=2)
    first, second = study.trials
    assert first.user_attrs["failure"] == "kv_insufficient" and len(engine.booted) == 1
    assert second.user_attrs["failure"] == "screened" and second.user_attrs["booted"] is False
    assert second.user_attrs["config_kind"] == ENQUEUED_KIND
