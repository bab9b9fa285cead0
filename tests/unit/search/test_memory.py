"""The memory screen against real engine output: calibrated on one captured boot, it must predict
the KV cache of another captured boot, and reject the configs that really failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.engines.base import Config, Device, ModelSpec
from tuner.search.memory import GIB, Observation, estimate, observation, parse_facts, read_shape, screen_key

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures"
H200 = json.loads((CAPTURES / "vllm-0.26-h200" / "pynvml_with_60GiB_held.json").read_text())
GPU = Device("cuda", H200["name"], H200["total"])


def _log(name: str) -> str:
    return (CAPTURES / name).read_text()


@pytest.fixture
def model_8b(tmp_path: Path) -> ModelSpec:
    (tmp_path / "config.json").write_text((CAPTURES / "llama-8b-shaped-config.json").read_text())
    return ModelSpec(str(tmp_path), {}, 8192, "dummy")


def test_facts_from_real_vllm_and_sglang_logs() -> None:
    cpu_ok = parse_facts(_log("vllm-0.32-cpu/boot_ok_kv_bytes_120000000.log"))
    assert cpu_ok["kv_tokens"] == 29184
    cpu_fail = parse_facts(_log("vllm-0.32-cpu/fail_kv_cache_needed_kv_bytes_26843545.log"))
    assert cpu_fail["max_len_fit"] == 1664 and "kv_tokens" not in cpu_fail
    gpu = parse_facts(_log("vllm-0.26-h200/boot_ok_8b_dummy_default.log"))
    assert gpu["kv_tokens"] == 919824
    assert gpu["available_kv_bytes"] == pytest.approx(112.28 * GIB) and gpu["weights_bytes"] == pytest.approx(15 * GIB)
    assert parse_facts(_log("vllm-0.26-h200/fail_free_memory_below_util_shared_gpu.log"))["shared_gpu"] == 1.0
    sglang = parse_facts(_log("sglang-0.5.17-h200/boot_ok_8b_dummy_default.log"))
    assert sglang["kv_tokens"] == 905811 and sglang["available_kv_bytes"] == pytest.approx(110.58 * GIB)
    assert parse_facts(_log("sglang-0.5.17-h200/fail_mem_fraction_0.1_exit137.log"))["min_fraction"] == 0.109


def test_the_8b_shape_gives_llamas_kv_bytes_per_token(model_8b: ModelSpec) -> None:
    shape = read_shape(model_8b.path, dummy=True)
    assert shape is not None
    assert shape.kv_bytes_per_token == 131072  # 2 x 32 layers x 8 KV heads x 128 x 2 bytes
    # vLLM's own figures in the capture: 112.28 GiB of KV cache held 919,824 tokens
    assert pytest.approx(shape.kv_bytes_per_token, rel=0.001) == 112.28 * GIB / 919824
    assert 7.9e9 < shape.weights_bytes / 2 < 8.1e9  # about 8 billion parameters in bf16


def _calibrated_on_default_boot(model: ModelSpec) -> Observation:
    config = Config("vllm", {})
    first = estimate(config, model, GPU, [], 0.92, 8192)
    assert first is not None
    attrs = {"memory_estimate": first.as_dict(), "failure": None,
             "memory_facts": parse_facts(_log("vllm-0.26-h200/boot_ok_8b_dummy_default.log"))}  # fmt: skip
    seen = observation(attrs)
    assert seen is not None and seen.booted is True and seen.overhead_bytes is not None
    return seen


def test_calibrated_on_one_real_boot_it_predicts_another(model_8b: ModelSpec) -> None:
    seen = _calibrated_on_default_boot(model_8b)
    assert 0 < seen.overhead_bytes < 3 * GIB  # activations and non-torch memory: 1.3 GiB in the log
    low = estimate(Config("vllm", {"memory_fraction": 0.135}), model_8b, GPU, [seen], 0.92, 8192)
    assert low is not None and low.fits
    # the real boot at 0.135 (boot_ok_low_memory_fraction_0.135_queueing.log) had 20,800 tokens
    assert parse_facts(_log("vllm-0.26-h200/boot_ok_low_memory_fraction_0.135_queueing.log"))["kv_tokens"] == 20800
    assert low.predicted_tokens == pytest.approx(20800, rel=0.05)


def test_it_rejects_what_really_failed(model_8b: ModelSpec) -> None:
    seen = _calibrated_on_default_boot(model_8b)
    tenth = estimate(Config("vllm", {"memory_fraction": 0.10}), model_8b, GPU, [seen], 0.92, 8192)
    assert tenth is not None and not tenth.fits  # fail_kv_no_memory_util_0.10.log: no cache blocks
    # with another process holding 60 GiB (the pynvml capture), 0.92 cannot start; 0.5 can
    shared = estimate(Config("vllm", {"memory_fraction": 0.92}), model_8b, GPU, [seen], 0.92, 8192, H200["free"])
    assert shared is not None and not shared.fits and "free memory" in shared.basis
    half = estimate(Config("vllm", {"memory_fraction": 0.5}), model_8b, GPU, [seen], 0.92, 8192, H200["free"])
    assert half is not None and half.fits


def _cpu_obs(fraction: float, booted: bool, tokens: float | None, model: ModelSpec) -> Observation:
    key = screen_key(Config("vllm", {}), CPU, model)
    return Observation(key, "vllm", fraction, booted, tokens, fraction * CPU.memory_bytes, None)


CPU = Device("cpu", "x86_64 CPU", 32 * 2**20)


def test_observations_decide_before_the_model(model_8b: ModelSpec) -> None:
    small = ModelSpec(model_8b.path, {}, 2048, "dummy")
    failed = _cpu_obs(0.3, False, 1664, small)
    at = estimate(Config("vllm", {"memory_fraction": 0.25}), small, CPU, [failed], 0.92, 2048)
    assert at is not None and not at.fits and "0.3 ran out of memory" in at.basis
    booted = _cpu_obs(0.6, True, 4000, small)
    above = estimate(Config("vllm", {"memory_fraction": 0.7}), small, CPU, [booted], 0.92, 2048)
    assert above is not None and above.fits and "booted" in above.basis


def test_uncalibrated_it_only_rejects_what_is_far_off(model_8b: ModelSpec) -> None:
    small = ModelSpec(model_8b.path, {}, 2048, "dummy")  # 128 KiB per token: 2048 tokens need 256 MiB
    budget = Device("cpu", "x86_64 CPU", 400 * 2**20)
    near = estimate(Config("vllm", {"memory_fraction": 0.5}), small, budget, [], 0.92, 2048)  # 200 MiB
    assert near is not None and near.fits and near.basis == "first principles"
    far = estimate(Config("vllm", {"memory_fraction": 0.2}), small, budget, [], 0.92, 2048)  # 80 MiB
    assert far is not None and not far.fits


def test_a_line_through_two_points_learns_the_engines_fixed_part(model_8b: ModelSpec) -> None:
    small = ModelSpec(model_8b.path, {}, 2048, "dummy")
    # tokens = (bytes - 1 MiB) / 6 KiB, seen at two budgets: the prediction at a third is on that line
    points = [_cpu_obs(f, True, (f * CPU.memory_bytes - 2**20) / 6144, small) for f in (0.5, 0.95)]
    est = estimate(Config("vllm", {"memory_fraction": 0.7}), small, CPU, points, 0.92, 2048)
    assert est is not None
    assert est.predicted_tokens == pytest.approx((0.7 * CPU.memory_bytes - 2**20) / 6144, abs=2)


def test_no_config_file_means_no_screen(tmp_path: Path) -> None:
    assert estimate(Config("vllm", {}), ModelSpec(str(tmp_path)), CPU, [], 0.92, 2048) is None
    assert estimate(Config("sglang", {}), ModelSpec(str(tmp_path)), CPU, [], None, 1) is None


def test_sglang_with_a_draft_reports_the_targets_memory_not_the_drafts() -> None:
    """SGLang logs the draft's weights and KV cache after the target's, in the same words (H200 block
    of the capacity study: reading the draft's made the screen refuse every later chunk-2048 config)."""
    facts = parse_facts(_log("sglang-0.5.17-h200/boot_ok_8b_standalone_draft_k3.log"))
    assert facts["weights_bytes"] == pytest.approx(15.02 * GIB)
    assert facts["available_kv_bytes"] == pytest.approx((50.73 + 50.73) * GIB)
    alone = parse_facts(_log("sglang-0.5.17-h200/boot_ok_8b_dummy_default.log"))
    assert alone["weights_bytes"] > 10 * GIB and alone["available_kv_bytes"] > 50 * GIB
