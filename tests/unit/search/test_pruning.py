"""The pruner compares a running trial with finished ones at the same point of the same workload."""

from __future__ import annotations

import math

import pytest

from tuner.client.driver import RequestRecord
from tuner.search.pruning import (
    MIN_REQUESTS,
    MIN_SAVED_OF_BOOT,
    FrontWatch,
    Pruned,
    checkpoint_counts,
    checkpoints,
    running_values,
)


def _rows(n: int, ttft_s: float, gap_s: float, tokens: int = 48) -> list[dict[str, object]]:
    """n requests, one after another: each takes ttft_s to its first token and gap_s more to its end."""
    rows, t = [], 0.0
    for _ in range(n):
        rows.append({"sent_s": t, "first_s": t + ttft_s, "done_s": t + ttft_s + gap_s, "output_tokens": tokens,
                     "prompt_tokens": 900, "error": None})  # fmt: skip
        t += ttft_s + gap_s
    return rows


def _records(rows: list[dict[str, object]], t0: float) -> list[RequestRecord]:
    return [
        RequestRecord(
            str(i), t0 + r["sent_s"], t0 + r["first_s"], t0 + r["done_s"], (), (), r["output_tokens"], 900, None
        )  # type: ignore[operator]
        for i, r in enumerate(rows)
    ]


def test_checkpoints_are_quarters_of_the_workload_and_skip_tiny_ones() -> None:
    assert checkpoint_counts(40) == [10, 20, 30]
    assert checkpoint_counts(16) == [8, 12]
    assert all(c >= MIN_REQUESTS for c in checkpoint_counts(12))


def test_running_values_follow_the_definitions() -> None:
    values = running_values(_rows(10, 0.1, 0.9), {"ttft_p95_ms": 150.0})
    assert values["ttft_p95_ms"] == pytest.approx(100.0)
    assert values["output_throughput_tok_s"] == pytest.approx(48.0)  # 480 tokens in 10 s
    assert values["goodput_req_s"] == pytest.approx(1.0)
    assert running_values([], {})["ttft_p95_ms"] == math.inf


def _watch(reference_rows: list[dict[str, object]], objective: str = "pareto") -> FrontWatch:
    ref = checkpoints(reference_rows, {"ttft_p95_ms": 500.0})
    return FrontWatch(len(reference_rows), {7: ref}, objective, {"ttft_p95_ms": 500.0}, 1000.0)


def test_a_trial_clearly_dominated_at_a_checkpoint_is_stopped_there() -> None:
    watch = _watch(_rows(40, 0.1, 0.5))
    with pytest.raises(Pruned) as stopped:
        for record in _records(_rows(40, 0.3, 1.5), 1000.0):  # 3x slower on both counts
            watch(record)
    info = stopped.value.info
    assert info["at_requests"] == 10 and info["of"] == 40 and info["beaten_by"] == 7
    assert info["saved_s"] == pytest.approx(18.0 * 30 / 10, rel=0.01)  # the 30 left at its own pace


@pytest.mark.parametrize(
    "ttft_s, gap_s",
    [(0.1, 0.5), (0.11, 0.55), (0.3, 0.3)],  # as good; within the margin; worse TTFT, same throughput
)
def test_a_trial_not_clearly_worse_on_every_objective_runs_to_its_end(ttft_s: float, gap_s: float) -> None:
    watch = _watch(_rows(40, 0.1, 0.5))
    for record in _records(_rows(40, ttft_s, gap_s), 1000.0):
        watch(record)
    assert len(watch.done) == 40


def test_single_objective_pruning_compares_that_objective() -> None:
    watch = _watch(_rows(40, 0.1, 0.5), objective="throughput")
    with pytest.raises(Pruned):
        for record in _records(_rows(40, 0.1, 1.5), 1000.0):
            watch(record)


def test_a_trial_whose_rest_is_short_against_its_boot_is_not_pruned() -> None:
    """As on the H200 (boot 70-175 s, drive 3-6 s): stopping would save little and lose the metrics."""
    ref = checkpoints(_rows(40, 0.1, 0.5), {"ttft_p95_ms": 500.0})
    rows = _rows(40, 0.3, 1.5)  # clearly dominated; 18 s for the first 10, 54 s left at its pace
    slow = 54.0 / MIN_SAVED_OF_BOOT * 1.1
    slow_boot = FrontWatch(40, {7: ref}, "pareto", {"ttft_p95_ms": 500.0}, 1000.0, boot_s=slow)
    for record in _records(rows, 1000.0):
        slow_boot(record)
    assert len(slow_boot.done) == 40
    quick = 54.0 / MIN_SAVED_OF_BOOT * 0.9
    quick_boot = FrontWatch(40, {7: ref}, "pareto", {"ttft_p95_ms": 500.0}, 1000.0, boot_s=quick)
    with pytest.raises(Pruned):  # a bit more than the share of this boot: worth it
        for record in _records(rows, 1000.0):
            quick_boot(record)
