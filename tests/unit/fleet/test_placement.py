"""GPU placement against readings captured on an H200 (tests/data/captures), including a GPU held
by another process's 60 GiB."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.fleet.placement import GpuReading, busy_reason, parse_gpus, slot_busy, slots

CAPTURE = Path(__file__).resolve().parents[2] / "data" / "captures" / "vllm-0.26-h200" / "pynvml_with_60GiB_held.json"


def _captured(index: int = 0) -> GpuReading:
    raw = json.loads(CAPTURE.read_text())
    return GpuReading(index, raw["name"], raw["total"], raw["used"], tuple((p, b) for p, b in raw["procs"]))


def _idle(index: int) -> GpuReading:
    return GpuReading(index, "NVIDIA H200", 150754820096, 520 * 2**20, ())


def test_a_gpu_held_by_a_foreign_process_is_skipped_and_says_why() -> None:
    reason = busy_reason(_captured(), ours=[1234])
    assert reason == "GPU 0 is busy: pid 2446, not started by this tuner, holds 60.5 GiB"


def test_our_own_engine_on_the_gpu_does_not_make_it_busy() -> None:
    assert busy_reason(_captured(), ours=[2446]) is None


def test_an_idle_gpu_is_free_and_memory_without_a_visible_process_is_not() -> None:
    assert busy_reason(_idle(1), ours=[]) is None
    hidden = GpuReading(2, "NVIDIA H200", 150754820096, 20 * 2**30, ())  # e.g. a process in another container
    assert "20.0 GiB in use by processes not visible here" in (busy_reason(hidden, ours=[]) or "")


def test_a_slot_is_busy_when_any_of_its_gpus_is() -> None:
    readings = {0: _idle(0), 1: _captured(1)}

    def reader(indices: list[int]) -> list[GpuReading]:
        return [readings[i] for i in indices]

    assert slot_busy((0,), [], reader) is None
    assert "GPU 1 is busy: pid 2446" in (slot_busy((0, 1), [], reader) or "")


def test_gpus_are_cut_into_slots_of_gpus_per_trial() -> None:
    assert slots([0, 1, 2, 3], 2) == [(0, 1), (2, 3)]
    assert slots([0, 1, 2, 3], 1) == [(0,), (1,), (2,), (3,)]
    assert parse_gpus("0,1, 3") == [0, 1, 3]


@pytest.mark.parametrize(("gpus", "per_trial", "message"), [
    ([0, 1, 2], 2, "do not divide"), ([0], 2, "needs at least 2"), ([0, 1], 0, "at least 1"),
])  # fmt: skip
def test_impossible_slots_are_config_errors(gpus: list[int], per_trial: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        slots(gpus, per_trial)


@pytest.mark.parametrize("text", ["", "a,b", "0,0", "-1"])
def test_bad_gpu_lists_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError, match="--gpus"):
        parse_gpus(text)
