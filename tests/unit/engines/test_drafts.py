"""Heads and drafts told apart from their files, and refused in one line when they cannot serve the target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.engines.drafts import check_fits, draft_kind, mtp_layers, split_kind
from tuner.engines.models import user_models
from tuner.errors import ConfigError

TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "vocab_size": 5733,
    "max_position_embeddings": 4096,
}


def _folder(root: Path, name: str, **config: object) -> str:
    (root / name).mkdir()
    (root / name / "config.json").write_text(json.dumps(config))
    return str(root / name)


@pytest.mark.parametrize(
    ("architectures", "kind"),
    [
        (["LlamaForCausalLMEagle3"], "eagle3"),  # SGLang's and vLLM's name for a Llama EAGLE-3 head
        (["Eagle3LlamaForCausalLM"], "eagle3"),
        (["LlamaForCausalLMEagle"], "eagle"),  # SGLang's EAGLE head
        (["EagleLlamaForCausalLM"], "eagle"),  # vLLM's
        (["LlamaForCausalLMEagle", "EagleLlamaForCausalLM"], "eagle"),  # the generated one names both
        (["LlamaForCausalLM"], "draft_model"),
        ([], "draft_model"),
    ],
)
def test_the_kind_is_read_from_the_architectures(tmp_path: Path, architectures: list[str], kind: str) -> None:
    path = _folder(tmp_path, "d", architectures=architectures, hidden_size=256, vocab_size=5733)
    assert draft_kind(path) == (kind, path)


def test_a_kind_given_before_the_path_wins(tmp_path: Path) -> None:
    """EAGLE-1 heads often name a plain Llama architecture: ``eagle:PATH`` says what it is."""
    path = _folder(tmp_path, "head", architectures=["LlamaForCausalLM"], hidden_size=256, vocab_size=5733)
    assert draft_kind(f"eagle:{path}") == ("eagle", path)
    assert split_kind("/models/a:b") == (None, "/models/a:b"), "a colon in a path is no kind"


def test_user_models_record_each_kind_and_the_targets_mtp_layers(tmp_path: Path) -> None:
    target = _folder(tmp_path, "target", **TARGET, num_nextn_predict_layers=1)
    head = _folder(tmp_path, "h3", architectures=["LlamaForCausalLMEagle3"], hidden_size=256, vocab_size=5733,
                   draft_vocab_size=1433)  # fmt: skip
    draft = _folder(tmp_path, "small", architectures=["LlamaForCausalLM"], hidden_size=128, vocab_size=5733)
    spec = user_models(target, [head, draft], 2048)
    assert spec.draft_kinds == {"h3": "eagle3", "small": "draft_model"}
    assert spec.drafts_for("eagle3") == ["h3"] and spec.drafts_for("draft_model") == ["small"]
    assert spec.mtp_layers == 1 == mtp_layers(target)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "vocab_size": 5733},
         "an EAGLE-3 head for hidden size 4096 cannot serve"),
        ({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 256, "vocab_size": 128256},
         "an EAGLE-3 head of vocabulary 128256 cannot serve"),
        ({"architectures": ["EagleLlamaForCausalLM"], "hidden_size": 512, "target_hidden_size": 512,
          "vocab_size": 5733}, "an EAGLE head for hidden size 512"),
        ({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "vocab_size": 32000},
         "a draft model of vocabulary 32000 cannot serve"),
        ({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 256, "vocab_size": 5733,
          "draft_vocab_size": 9000}, "draft_vocab_size 9000 is not part of the vocabulary 5733"),
    ],
)  # fmt: skip
def test_a_head_or_draft_that_does_not_fit_the_target_is_one_line(
    tmp_path: Path, config: dict[str, object], says: str
) -> None:
    target = _folder(tmp_path, "target", **TARGET)
    bad = _folder(tmp_path, "bad", **config)
    with pytest.raises(ConfigError) as info:
        user_models(target, [bad], 2048)
    assert says in str(info.value) and "\n" not in str(info.value)


def test_an_eagle3_head_with_its_targets_hidden_size_fits(tmp_path: Path) -> None:
    target = _folder(tmp_path, "target", **TARGET)
    head = _folder(tmp_path, "h", architectures=["LlamaForCausalLMEagle3"], hidden_size=512, target_hidden_size=256,
                   vocab_size=5733)  # fmt: skip
    check_fits("eagle3", head, target)


def test_a_folder_without_a_config_is_refused(tmp_path: Path) -> None:
    target = _folder(tmp_path, "target", **TARGET)
    with pytest.raises(ConfigError, match="no readable config.json"):
        user_models(target, [str(tmp_path / "nowhere")], 2048)
