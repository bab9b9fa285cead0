"""The memory screen's cost of each speculative method, on the generated models' real files: a draft
model's weights and KV, a head's weights and its one layer's KV, MTP the KV of the target's MTP
layers, n-gram and suffix nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.env import probe
from tuner.engines.models import default_models
from tuner.engines.vllm import VllmAdapter
from tuner.search.memory import estimate, read_shape, screen_key

CPU = Device("cpu", "cpu", 32 * 2**20)


@pytest.fixture(scope="module")
def model() -> ModelSpec:
    return default_models(probe(VllmAdapter()).python, 768)


def _estimate(model: ModelSpec, params: dict[str, object]):  # type: ignore[no-untyped-def]
    found = estimate(Config("vllm", {"memory_fraction": 0.5, **params}), model, CPU, [], 0.92, 768)
    assert found is not None
    return found


def test_each_method_costs_what_it_loads(model: ModelSpec) -> None:
    target = read_shape(model.path)
    assert target is not None
    plain = _estimate(model, {})
    assert plain.kv_bytes_per_token == target.kv_bytes_per_token and plain.weights_bytes == target.weights_bytes
    for method in ("ngram", "suffix"):  # proposals from the prompt: no weights, no KV
        free = _estimate(model, {"spec_method": method, "num_speculative_tokens": 3})
        assert (free.kv_bytes_per_token, free.weights_bytes, free.key) == (
            plain.kv_bytes_per_token, plain.weights_bytes, plain.key,
        )  # fmt: skip
    for method, draft in (("draft_model", "draft-2l"), ("eagle3", "eagle3-head"), ("eagle", "eagle-head")):
        shape = read_shape(model.drafts[draft])
        assert shape is not None
        with_it = _estimate(model, {"spec_method": method, "num_speculative_tokens": 3, "draft_model": draft})
        assert with_it.kv_bytes_per_token == plain.kv_bytes_per_token + shape.kv_bytes_per_token
        assert with_it.weights_bytes == plain.weights_bytes + shape.weights_bytes
        assert draft in with_it.key
    # a head's KV is its one layer's: a quarter of the 4-layer target's, a half of the 2-layer draft's
    heads = [read_shape(model.drafts[h]) for h in ("eagle3-head", "eagle-head")]
    assert all(h is not None and 4 * h.kv_bytes_per_token == target.kv_bytes_per_token for h in heads)


def test_mtp_costs_the_kv_of_the_targets_mtp_layers(model: ModelSpec, tmp_path: Path) -> None:
    config = json.loads((Path(model.path) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    mtp = ModelSpec(str(tmp_path), {}, 768, "dummy", mtp_layers=1)
    plain, with_mtp = _estimate(mtp, {}), _estimate(mtp, {"spec_method": "mtp", "num_speculative_tokens": 1})
    assert (
        with_mtp.kv_bytes_per_token
        == plain.kv_bytes_per_token * (config["num_hidden_layers"] + 1) / config["num_hidden_layers"]
    )
    assert with_mtp.weights_bytes == plain.weights_bytes, "the MTP layers' weights are the target's own"
    assert "|mtp|" in with_mtp.key and "|-|" in plain.key


def test_screen_keys_of_a_config_recorded_before_methods_were_a_parameter(model: ModelSpec) -> None:
    old_ngram = Config("vllm", {"num_speculative_tokens": 2, "draft_model": "ngram"})
    old_draft = Config("vllm", {"num_speculative_tokens": 2, "draft_model": "draft-1l"})
    assert screen_key(old_ngram, CPU, model) == screen_key(Config("vllm", {}), CPU, model)
    assert "|draft-1l|" in screen_key(old_draft, CPU, model)
