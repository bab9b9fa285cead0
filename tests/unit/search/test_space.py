"""Search spaces: YAML validation (every error names its key) and sampling with a real Optuna study."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest

from tests.unit.search.offers import DRAFTS, model_of, offers
from tuner.engines.base import Config, ModelSpec
from tuner.errors import ConfigError
from tuner.search.scoring import DIRECTIONS
from tuner.search.space import DEFAULT_SPACE, Space, load_space, suggest


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> str:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_space(path)
    message = str(info.value)
    assert str(path) in message, "the message should say which file is wrong"
    assert "\n" not in message, "a ConfigError is printed as one line"
    return message


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(directions=DIRECTIONS, sampler=optuna.samplers.RandomSampler(seed=7))


# --- loading -------------------------------------------------------------------------------------


def test_default_space_loads_and_is_usable() -> None:
    space = load_space()
    assert space == load_space(DEFAULT_SPACE)
    assert space.engines == ["vllm", "sglang"]
    p = space.parameters
    assert p.chunk_size is not None and p.max_num_seqs is not None
    assert all(isinstance(c, int) and c > 0 for c in [*p.chunk_size.choices, *p.max_num_seqs.choices])
    assert p.memory_fraction is not None
    assert 0.0 < p.memory_fraction.low < p.memory_fraction.high <= 1.0
    assert p.num_speculative_tokens is not None
    assert "off" in p.methods(), "speculation must be able to be off"
    assert set(p.methods()) == {"off", "draft_model", "eagle3", "eagle", "mtp", "ngram", "suffix"}, "every method"
    assert p.num_speculative_tokens.high > 0, "and on"
    assert space.static.max_model_len > 0


def test_empty_mapping_gives_defaults(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "{}\n"))
    assert space.engines == ["vllm"]
    assert space.parameters.chunk_size is None and space.parameters.num_speculative_tokens is None


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError, match="cannot read"):
        load_space(missing)


def test_bad_yaml(tmp_path: Path) -> None:
    assert "not valid YAML" in _error(tmp_path, "engines: [vllm\nparameters: {\n")


@pytest.mark.parametrize("text", ["- vllm\n- sglang\n", "just a string\n", "42\n", ""])
def test_not_a_mapping(tmp_path: Path, text: str) -> None:
    assert "mapping" in _error(tmp_path, text)


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = _error(tmp_path, "engines: [vllm]\ntrails: 5\n")
    assert "trails" in message


def test_unknown_key_inside_chunk_size(tmp_path: Path) -> None:
    message = _error(tmp_path, "parameters:\n  chunk_size: {choices: [512], step: 2}\n")
    assert "parameters.chunk_size" in message
    assert "step" in message


def test_unknown_parameter(tmp_path: Path) -> None:
    message = _error(tmp_path, "parameters:\n  pipeline_parallel: {choices: [1, 2]}\n")
    assert "parameters.pipeline_parallel" in message


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("parameters:\n  num_speculative_tokens: {low: 4, high: 1}\n", "parameters.num_speculative_tokens"),
        ("parameters:\n  memory_fraction: {low: 0.9, high: 0.5}\n", "parameters.memory_fraction"),
    ],
)
def test_low_above_high(tmp_path: Path, text: str, key: str) -> None:
    message = _error(tmp_path, text)
    assert key in message
    assert "below low" in message or "low" in message


@pytest.mark.parametrize("bound", ["low: 0.5, high: 1.2", "low: 1.5, high: 1.5", "low: 0.0, high: 0.5"])
def test_memory_fraction_outside_zero_one(tmp_path: Path, bound: str) -> None:
    message = _error(tmp_path, f"parameters:\n  memory_fraction: {{{bound}}}\n")
    assert "parameters.memory_fraction" in message


@pytest.mark.parametrize("choices", ["[0, 512]", "[512, big]", "[512, '1024']", "[-1]", "[512.5]", "[]"])
def test_bad_chunk_size_choices(tmp_path: Path, choices: str) -> None:
    message = _error(tmp_path, f"parameters:\n  chunk_size: {{choices: {choices}}}\n")
    assert "parameters.chunk_size" in message


def test_boolean_chunk_size_choice_is_refused(tmp_path: Path) -> None:
    message = _error(tmp_path, "parameters:\n  chunk_size: {choices: [true]}\n")
    assert "parameters.chunk_size" in message


def test_bad_max_num_seqs_choices(tmp_path: Path) -> None:
    assert "parameters.max_num_seqs" in _error(tmp_path, "parameters:\n  max_num_seqs: {choices: [4, 0]}\n")


@pytest.mark.parametrize("text", ["engines: [tgi]\n", "engines: [vllm, trtllm]\n", "engine_envs: {tgi: /x}\n"])
def test_unknown_engine_is_refused(tmp_path: Path, text: str) -> None:
    message = _error(tmp_path, text)
    assert "unknown engine" in message
    assert ("tgi" in message) or ("trtllm" in message)


@pytest.mark.parametrize(
    ("text", "key"), [("engines: [tgi]\n", "engines"), ("engine_envs: {tgi: /x}\n", "engine_envs")]
)
def test_unknown_engine_message_names_its_key(tmp_path: Path, text: str, key: str) -> None:
    message = _error(tmp_path, text)
    assert f": {key}" in message, message


def test_empty_engine_list(tmp_path: Path) -> None:
    assert "engines" in _error(tmp_path, "engines: []\n")


# --- sampling ------------------------------------------------------------------------------------


def _default_space() -> Space:
    return load_space()


def _sample(
    study: optuna.Study, space: Space, drafts: list[str], model: ModelSpec | None = None, engine: str = "vllm"
) -> tuple[optuna.Trial, Config]:
    trial = study.ask()
    return trial, suggest(trial, space, offers(space, [engine], model or model_of(drafts)), is_default=False)


def test_sampled_params_are_named_per_engine() -> None:
    study, space = _study(), _default_space()
    for _ in range(25):
        trial, config = _sample(study, space, DRAFTS)
        assert config.engine == "vllm" == trial.params["engine"]
        tuned = {k: v for k, v in trial.params.items() if k != "engine"}
        assert tuned, "the default space tunes something"
        assert all(k.startswith("vllm.") for k in tuned), tuned
        # what the study records is what the engine gets (a float may be rounded off its step grid)
        # (a draft is recorded under its method's name: vllm.<method>.draft)
        method = config.params.get("spec_method")
        engine_side = {
            f"vllm.{method}.draft" if k == "draft_model" else f"vllm.{k}": v for k, v in config.params.items()
        }
        assert set(tuned) == set(engine_side)
        for key, value in tuned.items():
            if isinstance(value, float):
                assert engine_side[key] == pytest.approx(value, abs=1e-6), key
            else:
                assert engine_side[key] == value, key
        assert not config.is_default
        study.tell(trial, [1.0, 1.0])


def test_sampled_values_stay_inside_the_space() -> None:
    study, space = _study(), _default_space()
    p = space.parameters
    assert p.chunk_size and p.max_num_seqs and p.memory_fraction and p.num_speculative_tokens
    for _ in range(25):
        trial, config = _sample(study, space, DRAFTS)
        params = config.params
        assert params["chunk_size"] in p.chunk_size.choices
        assert params["max_num_seqs"] in p.max_num_seqs.choices
        f = params["memory_fraction"]
        assert p.memory_fraction.low - 1e-9 <= f <= p.memory_fraction.high + 1e-9
        if p.memory_fraction.step:
            steps = (f - p.memory_fraction.low) / p.memory_fraction.step
            assert math.isclose(steps, round(steps), abs_tol=1e-6), f
        if params["spec_method"] != "off":
            assert p.num_speculative_tokens.low <= params["num_speculative_tokens"] <= p.num_speculative_tokens.high
        study.tell(trial, [1.0, 1.0])


def test_draft_model_sampled_only_when_speculation_is_on() -> None:
    study, space = _study(), _default_space()
    study.enqueue_trial({"engine": "vllm", "vllm.spec_method": "off"})
    study.enqueue_trial({"engine": "vllm", "vllm.spec_method": "draft_model", "vllm.num_speculative_tokens": 3})
    seen = set()
    for _ in range(40):
        trial, config = _sample(study, space, DRAFTS)
        method = trial.params["vllm.spec_method"]
        assert config.params["spec_method"] == method
        if method == "off":
            assert set(config.params) & {"num_speculative_tokens", "draft_model"} == set()
            assert not [k for k in trial.params if k.endswith(".draft") or k.endswith("speculative_tokens")]
        else:
            assert config.params["num_speculative_tokens"] == trial.params["vllm.num_speculative_tokens"] >= 1
        if method == "draft_model":
            assert trial.params["vllm.draft_model.draft"] in DRAFTS
            assert config.params["draft_model"] == trial.params["vllm.draft_model.draft"]
        seen.add(method)
        study.tell(trial, [1.0, 1.0])
    # the generated drafts only: no head, no MTP layers, no arctic_inference is not known (assumed)
    assert seen == {"off", "draft_model", "ngram", "suffix"}


def test_each_method_gets_only_the_heads_that_serve_it_and_its_engines_own_parameters(tmp_path: Path) -> None:
    space = load_space(
        _write(
            tmp_path,
            "engines: [vllm, sglang]\nparameters:\n  spec_method: {choices: [eagle3, eagle, ngram, draft_model]}\n"
            "  num_speculative_tokens: {low: 1, high: 3}\n  ngram_lookup: {choices: [[2, 4]]}\n"
            "  spec_tree: {choices: [[4, 8]]}\n",
        )
    )
    model = model_of(["draft-2l", "eagle3-head", "eagle-head"], {"eagle3-head": "eagle3", "eagle-head": "eagle"})
    serves = {"eagle3": "eagle3-head", "eagle": "eagle-head", "draft_model": "draft-2l"}
    for engine in ("vllm", "sglang"):
        study = _study()
        for _ in range(40):
            trial, config = _sample(study, space, [], model, engine)
            p, method = config.params, config.params["spec_method"]
            assert p.get("draft_model") == serves.get(method), p
            assert ("ngram_lookup" in p) == (engine == "vllm" and method == "ngram"), p
            assert ("spec_tree" in p) == (engine == "sglang" and method != "ngram"), p
            assert p.get("ngram_lookup", [2, 4]) == [2, 4] and p.get("spec_tree", [4, 8]) == [4, 8]
            study.tell(trial, [1.0, 1.0])


def test_a_bare_off_in_yaml_is_the_method_and_k_counts_from_one(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "parameters:\n  spec_method: {choices: [off, ngram]}\n"
                                        "  num_speculative_tokens: {choices: [2]}\n"))  # fmt: skip
    assert space.parameters.methods() == ("off", "ngram")
    message = _error(tmp_path, "parameters:\n  spec_method: {choices: [off, ngram]}\n"
                               "  num_speculative_tokens: {low: 0, high: 2}\n")  # fmt: skip
    assert "off is a method of its own" in message
    assert "unknown method 'eagle4'" in _error(tmp_path, "parameters:\n  spec_method: {choices: [eagle4]}\n")
    assert "give num_speculative_tokens" in _error(tmp_path, "parameters:\n  spec_method: {choices: [ngram]}\n")


def test_draft_choices_from_yaml_override_model_drafts(tmp_path: Path) -> None:
    """A space written before methods were a parameter: a method named as a draft is that method."""
    space = load_space(
        _write(
            tmp_path,
            "parameters:\n  num_speculative_tokens: {low: 2, high: 2}\n  draft_model: {choices: [ngram]}\n",
        )
    )
    study = _study()
    trial, config = _sample(study, space, DRAFTS)
    assert dict(config.params) == {"spec_method": "ngram", "num_speculative_tokens": 2}
    assert trial.params == {"engine": "vllm", "vllm.spec_method": "ngram", "vllm.num_speculative_tokens": 2}


def test_recorded_speculation_matches_the_config_without_drafts(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "parameters:\n  num_speculative_tokens: {low: 3, high: 3}\n"))
    trial, config = _sample(_study(), space, [])
    recorded = trial.params.get("vllm.num_speculative_tokens", 0)
    assert config.params.get("num_speculative_tokens", 0) == recorded == 0, "no draft: nothing to speculate with"


def test_untuned_parameters_are_not_sampled(tmp_path: Path) -> None:
    space = load_space(_write(tmp_path, "parameters:\n  max_num_seqs: {choices: [4]}\n"))
    trial, config = _sample(_study(), space, DRAFTS)
    assert dict(config.params) == {"max_num_seqs": 4}
    assert trial.params == {"engine": "vllm", "vllm.max_num_seqs": 4}


def test_default_trial_has_no_tuned_params() -> None:
    study, space = _study(), _default_space()
    study.enqueue_trial({"engine": "vllm"})
    trial = study.ask()
    config = suggest(trial, space, offers(space, ["vllm"]), is_default=True)
    assert config.is_default
    assert config.engine == "vllm"
    assert dict(config.params) == {}
    assert trial.params == {"engine": "vllm"}
    assert config.enforce_eager == space.static.enforce_eager
