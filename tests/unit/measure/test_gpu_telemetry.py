"""The tuner's pynvml readings (tuner.measure.telemetry), replayed from pynvml samples taken on the H200
beside the study (scripts/gpu/sidecar.py): one reading a second during trial 10 (vLLM, memory
fraction 0.95) and during trial 2 (the out-of-memory trial, while another process held 60 GiB).

A stand-in ``pynvml`` module serves the captured readings in order, so the code under test is the
tuner's own: ``gpu_used_bytes``, ``gpu_device`` and ``MemorySampler``'s peak.
"""

from __future__ import annotations

import json
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.study_files import H200_FIRST, recorded_attrs
from tuner.measure import telemetry

ROOT = Path(__file__).resolve().parents[3]
CAPTURES = ROOT / "tests" / "data" / "captures" / "vllm-0.26.0-h200-2026-12-01"
GIB = 2**30


def _load(name: str) -> tuple[dict[str, object], list[dict[str, object]]]:
    head, *rows = (json.loads(line) for line in (CAPTURES / name).read_text().splitlines())
    return head, [r for r in rows if "used" in r]


class _Memory:
    def __init__(self, row: dict[str, object]) -> None:
        self.total, self.used, self.free = row["total"], row["used"], row["free"]


def fake_pynvml(head: dict[str, object], rows: list[dict[str, object]]) -> types.ModuleType:
    """A pynvml that answers with the captured readings, one per nvmlDeviceGetMemoryInfo call
    (the last one again once they run out)."""
    mod = types.ModuleType("pynvml")
    feed: Iterator[dict[str, object]] = iter(rows)
    state = {"last": rows[0], "calls": 0, "open": 0}

    class NVMLError(Exception):
        pass

    def init() -> None:
        state["open"] += 1

    def shutdown() -> None:
        state["open"] -= 1

    def memory(handle: object) -> _Memory:
        state["calls"] += 1
        state["last"] = next(feed, state["last"])
        return _Memory(state["last"])

    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlShutdown = shutdown  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: head["count"]  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: head["name"]  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMemoryInfo = memory  # type: ignore[attr-defined]
    # the compute processes of the same reading (the sampler reads memory first, then processes)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [  # type: ignore[attr-defined]
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in state["last"]["procs"]
    ]
    mod.state = state  # type: ignore[attr-defined]
    return mod


def _recorded(number: int, key: str) -> object:
    return recorded_attrs(H200_FIRST)[number][key]


def test_captures_are_an_h200_with_its_real_total() -> None:
    head, rows = _load("pynvml-trial-0010.jsonl")
    assert head["name"] == "NVIDIA H200" and head["driver"] == "580.159.04" and head["count"] == 1
    assert {r["total"] for r in rows} == {150754820096}  # 140.4 GiB; nvidia-smi says 143771 MiB
    assert all(r["used"] + r["free"] == r["total"] for r in rows)


def test_gpu_device_reads_name_and_total(monkeypatch: pytest.MonkeyPatch) -> None:
    head, rows = _load("pynvml-trial-0010.jsonl")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(head, rows))
    device = telemetry.gpu_device()
    assert (device.kind, device.name, device.memory_bytes) == ("cuda", "NVIDIA H200", 150754820096)
    assert sys.modules["pynvml"].state["open"] == 0  # type: ignore[attr-defined]


def test_gpu_used_bytes_is_the_devices_used_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    head, rows = _load("pynvml-trial-0010.jsonl")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(head, rows))
    assert [telemetry.gpu_used_bytes() for _ in range(3)] == [r["used"] for r in rows[:3]]
    assert telemetry.gpu_used_bytes([0]) == rows[3]["used"]
    assert sys.modules["pynvml"].state["open"] == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("number", [10, 2])
def test_sampler_peak_over_the_replayed_trial_is_what_the_study_recorded(
    monkeypatch: pytest.MonkeyPatch, number: int
) -> None:
    """The sidecar's readings are independent of the tuner's own; both peaks agree within 0.1 GiB."""
    head, rows = _load(f"pynvml-trial-{number:04d}.jsonl")
    fake = fake_pynvml(head, rows)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(telemetry, "SAMPLE_EVERY_S", 0.001)
    with telemetry.MemorySampler("cuda", pid=0) as sampler:
        deadline = time.monotonic() + 10
        while fake.state["calls"] < len(rows) + 2 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.005)
    assert sampler.peak_bytes == max(r["used"] for r in rows)
    assert abs(sampler.peak_bytes - int(_recorded(number, "peak_memory_bytes"))) < 0.1 * GIB  # type: ignore[arg-type]


def test_the_oom_trials_reading_counts_the_other_tenants_60_gib() -> None:
    """pynvml's used memory is the device's, not the engine's: during trial 2 almost all of it was
    the holder's (one compute process of ~60.5 GiB), and the trial's recorded peak says ~61 GiB."""
    _, rows = _load("pynvml-trial-0002.jsonl")
    held = [r for r in rows if r["procs"] and r["procs"][0][1] > 60 * GIB]
    assert len(held) >= 30
    assert all(r["used"] > 61 * GIB for r in held)
    assert 61 * GIB < int(_recorded(2, "peak_memory_bytes")) < 62 * GIB  # type: ignore[arg-type]


def test_memory_fraction_bounds_the_measured_peak() -> None:
    """Across the study's served trials, peak = fraction x total + 1.0-1.6 GiB (CUDA contexts and
    the driver's share), for both engines: the flag really bounds memory on the GPU."""
    total = 150754820096
    for number, fraction in ((3, 0.85), (4, 0.7), (5, 0.9), (7, 0.9), (8, 0.75), (9, 0.75), (10, 0.95)):
        config = _recorded(number, "config")
        assert isinstance(config, dict) and config["memory_fraction"] == fraction
        over = int(_recorded(number, "peak_memory_bytes")) - fraction * total  # type: ignore[arg-type]
        assert 0.5 * GIB < over < 2.0 * GIB, (number, over / GIB)


@pytest.mark.parametrize(
    ("number", "engine_pid", "engine_gib"),
    [(10, 6025, (133.5, 134.0)), (2, 3614, (0.4, 0.6))],
)
def test_the_engines_own_share_leaves_out_other_processes(
    monkeypatch: pytest.MonkeyPatch, number: int, engine_pid: int, engine_gib: tuple[float, float]
) -> None:
    """Trial 10 began while the previous trial's engine (pid 5580, 106 GiB) was still letting go, and
    trial 2 beside the 60 GiB holder (pid 2176): the device peak counts them, the engine's own does not."""
    head, rows = _load(f"pynvml-trial-{number:04d}.jsonl")
    fake = fake_pynvml(head, rows)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(telemetry, "SAMPLE_EVERY_S", 0.001)
    monkeypatch.setattr(telemetry, "process_tree_pids", lambda pid: {pid})
    with telemetry.MemorySampler("cuda", pid=engine_pid) as sampler:
        deadline = time.monotonic() + 10
        while fake.state["calls"] < len(rows) + 2 and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.005)
    assert sampler.engine_peak_bytes is not None
    low, high = engine_gib
    assert low * GIB < sampler.engine_peak_bytes < high * GIB
    assert sampler.engine_peak_bytes < sampler.peak_bytes
    assert sys.modules["pynvml"].state["open"] == 0  # type: ignore[attr-defined]


def test_an_engine_pynvml_does_not_list_is_unknown_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a container pynvml may list the host's pids: no process of the tree matches, so None."""
    head, rows = _load("pynvml-trial-0010.jsonl")
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(head, rows[-5:]))
    assert telemetry.gpu_process_bytes({1}) is None
    assert telemetry.gpu_process_bytes({6025}) == rows[-5]["procs"][-1][1]


def test_a_gpu_that_lists_no_processes_keeps_the_device_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """nvmlDeviceGetComputeRunningProcesses raises NotSupported on some GPUs: the used memory stands."""
    head, rows = _load("pynvml-trial-0010.jsonl")
    fake = fake_pynvml(head, rows[-5:])

    def unsupported(handle: object) -> list[object]:
        raise fake.NVMLError("Not Supported")  # type: ignore[attr-defined]

    fake.nvmlDeviceGetComputeRunningProcesses = unsupported  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert telemetry.gpu_reading(None, {6025}) == (rows[-5]["used"], None)
    assert fake.state["open"] == 0  # type: ignore[attr-defined]
