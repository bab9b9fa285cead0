"""What an engine says it changed of the config it was given, read off real boot logs: vLLM 0.26 on the
H200 (block 6 of its study: a draft model with a K-by-batch-size schedule), vLLM 0.32's CPU build,
SGLang 0.5.17 on the H200 (tests/data/captures/README.md)."""

from __future__ import annotations

import re
import string
from pathlib import Path

import pytest

from tuner.engines import ADAPTERS
from tuner.engines.sglang import SglangAdapter
from tuner.engines.vllm import VllmAdapter

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "captures"


def _log(path: str) -> str:
    return (CAPTURES / path).read_text()


def test_vllm_026_with_a_draft_and_a_schedule_says_what_it_turned_off() -> None:
    assert VllmAdapter().overrides_in(_log("vllm-0.26.0-h200-2026-12-07/trial-0008-vllm-draft-taper-boot.log")) == [
        "async scheduling off (vLLM does not run it with draft_model)",
        "CUDA graphs piecewise only, not FULL_AND_PIECEWISE (a K-by-batch-size schedule)",
        "at most 7168 tokens scheduled a step (set for speculative decoding)",
        "the V1 model runner (V2 does not yet support speculative method 'draft_model')",
    ], "each said once, though the API server and the engine core both log two of them"


def test_vllm_032s_cpu_build_keeps_async_scheduling_with_a_draft() -> None:
    said = VllmAdapter().overrides_in(_log("vllm-0.32-cpu/boot_ok_draft_model_k3.log"))
    assert said == ["at most 1024 tokens scheduled a step (set for speculative decoding)",
                    "the V1 model runner (V2 requires Triton)"]  # fmt: skip
    assert VllmAdapter().overrides_in(_log("vllm-0.32-cpu/boot_ok_kv_bytes_120000000.log")) == [
        "the V1 model runner (V2 requires Triton)"
    ], "no draft: nothing reserved for drafting"


def test_sglang_caps_the_running_requests_with_speculation_and_says_so() -> None:
    adapter = SglangAdapter()
    assert adapter.overrides_in(_log("sglang-0.5.17-h200/boot_ok_8b_standalone_draft_k3.log")) == [
        "at most 48 running requests (SGLang's cap with speculation; --max-running-requests not given)"
    ]
    assert adapter.overrides_in(_log("sglang-0.5.17-h200/boot_ok_8b_dummy_default.log")) == []
    # SGLang's words where a method takes one value of a flag (arg_groups/speculative_hook.py)
    line = "DFLASH only supports speculative_num_steps == 1; overriding speculative_num_steps=3 to 1."
    assert adapter.overrides_in(line) == ["speculative_num_steps 1, not 3"]


@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_every_override_says_only_what_its_pattern_captures(name: str) -> None:
    for pattern, means in ADAPTERS[name]().config_overrides:
        fields = {f for _, f, _, _ in string.Formatter().parse(means) if f}
        assert fields <= set(re.compile(pattern).groupindex), (name, pattern, means)
