"""Resolving the capacity search once, at the top: the preset's tiers for the device, --slo over them."""

from __future__ import annotations

import math

import pytest

from tuner.engines.base import Device
from tuner.errors import ConfigError
from tuner.measure.capacity import CapacitySearch, judged_step
from tuner.search.options import SearchOptions
from tuner.search.resolve import CPU_STEPS, GPU_STEPS, capacity_plan, parse_slo_flags
from tuner.workloads import rag
from tuner.workloads.base import Workload

CPU = Device("cpu", "test CPU", 2**30)
GPU = Device("cuda", "test GPU", 140 * 2**30)


def _workload(tiers: rag.Tiers = rag.TIERS) -> Workload:
    return Workload(name="rag", seed=0, requests=(), warmup=(), concurrency=4, description="d", tiers=tiers)


def test_the_gpu_tiers_are_the_presets_and_capacity_scores_the_interactive_one() -> None:
    plan = capacity_plan(SearchOptions(workload="rag"), _workload(), GPU)
    assert plan is not None and plan.scored == ("interactive",)
    assert plan.tiers["interactive"] == {"ttft_p95_ms": 300.0, "tpot_p95_ms": 100.0}  # GuideLLM's RAG bounds
    assert plan.tiers["relaxed"] == {"ttft_p95_ms": 600.0, "tpot_p95_ms": 200.0}
    assert plan.start_rate == GPU_STEPS["start_rate"] and plan.target == 0.9 and plan.resolution == 0.1


def test_the_cpu_build_gets_its_own_tiers_and_shorter_steps() -> None:
    plan = capacity_plan(SearchOptions(workload="rag"), _workload(), CPU)
    assert plan is not None
    assert plan.tiers["interactive"] != rag.TIERS.gpu["interactive"].as_dict()
    assert plan.min_step_s == CPU_STEPS["min_step_s"] < GPU_STEPS["min_step_s"]


@pytest.mark.parametrize("device", [CPU, GPU], ids=["cpu", "gpu"])
def test_each_devices_steps_resolve_a_knee_up_to_32x_its_start_rate(device: Device) -> None:
    """A drive without an incumbent climbs from the start rate, then halves its bracket: its step budget
    must reach the resolution for any knee the climb can reach in five doublings, or the claim is a
    bracket wider than the plan promises."""
    plan = capacity_plan(SearchOptions(workload="rag"), _workload(), device)
    assert plan is not None
    for ratio in (1.3, 3.1, 7.7, 17.0, 19.5, 31.0):
        knee = plan.start_rate * ratio
        search = CapacitySearch(
            target=plan.target, resolution=plan.resolution, start_rate=plan.start_rate, max_steps=plan.max_steps
        )
        while (rate := search.next_rate()) is not None:
            attainment = 1.0 / (1.0 + math.exp(8.0 * (rate / knee - 1.0)) / 9.0)  # 0.9 exactly at the knee
            search.record(judged_step(rate, attainment, search.target))
        result = search.result()
        assert result.stop_reason == "resolved", (ratio, result.stop_reason, result.bracket_req_s)
        assert result.capacity_req_s <= knee < result.capacity_req_s * (1 + plan.resolution)


def test_pareto_scores_both_tiers_and_the_older_objectives_get_no_plan() -> None:
    both = capacity_plan(SearchOptions(workload="rag", objective="capacity-pareto"), _workload(), GPU)
    assert both is not None and both.scored == ("interactive", "relaxed")
    assert capacity_plan(SearchOptions(workload="rag", objective="pareto"), _workload(), GPU) is None


def test_slo_flags_override_a_tier_or_the_scored_one() -> None:
    plain, tiers = parse_slo_flags(["relaxed:ttft_p95_ms=900", "tpot_p95_ms=7"])
    assert tiers == {"relaxed": {"ttft_p95_ms": 900.0}} and plain == {"tpot_p95_ms": 7.0}
    opts = SearchOptions(workload="rag", tier="relaxed", slo=plain, slo_tiers={})
    plan = capacity_plan(opts, _workload(), GPU)
    assert plan is not None and plan.scored == ("relaxed",) and plan.tiers["relaxed"] == {"tpot_p95_ms": 7.0}
    opts = SearchOptions(workload="rag", slo_tiers=tiers)
    plan = capacity_plan(opts, _workload(), GPU)
    assert plan is not None and plan.tiers["relaxed"] == {"ttft_p95_ms": 900.0}


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (SearchOptions(workload="rag", objective="capacity-pareto", slo={"ttft_p95_ms": 5.0}), "name each"),
        (SearchOptions(workload="rag", slo={"ttft_p95_ms": 0.5}), "no request could meet it"),
        (SearchOptions(workload="rag", slo={"ttft_p95_ms": 500.0, "e2e_p95_ms": 400.0}), "ends after its first"),
        (SearchOptions(workload="rag", tier="fast"), "--tier"),
    ],
)
def test_bad_slos_are_one_config_error(opts: SearchOptions, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        capacity_plan(opts, _workload(), GPU)


def test_a_trace_without_tiers_needs_slo_flags() -> None:
    with pytest.raises(ConfigError, match="--slo interactive:"):
        capacity_plan(SearchOptions(workload="t.jsonl"), _workload(rag.Tiers()), GPU)
    given = SearchOptions(workload="t.jsonl", slo_tiers={"interactive": {"ttft_p95_ms": 300.0}})
    plan = capacity_plan(given, _workload(rag.Tiers()), GPU)
    assert plan is not None and plan.tiers == {"interactive": {"ttft_p95_ms": 300.0}}


@pytest.mark.parametrize("text", ["fast:ttft_p95_ms=1", "interactive:ttft=5", "interactive:ttft_p95_ms=-1"])
def test_bad_slo_flags_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_slo_flags([text])
