"""GPU placement: which GPUs a trial may use, checked with pynvml before every trial.

``--gpus 0,1,2,3 --gpus-per-trial N`` cuts the listed GPUs into slots of N; each slot runs one
trial at a time with ``CUDA_VISIBLE_DEVICES`` set to its GPUs, so trials never share a GPU. Before
a trial starts, every GPU of its slot is read: a GPU on which a process that this tuner did not
start holds memory, or whose used memory is above ``BUSY_BYTES`` with no process of ours on it, is
busy. The slot then waits and says why, once: the tuner never starts on top of someone else's job.
A tensor-parallel trial uses the first ``tp`` GPUs of its slot (``tp`` <= ``--gpus-per-trial``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tuner.errors import ConfigError

BUSY_BYTES = 1 << 30  # more than this used with none of our processes on it: someone else's


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str
    total_bytes: int
    used_bytes: int
    processes: tuple[tuple[int, int], ...]  # (pid, bytes) of every compute process on it


def parse_gpus(text: str) -> list[int]:
    try:
        gpus = [int(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ConfigError(f"--gpus {text!r}: expected GPU indices such as 0,1,2,3") from exc
    if not gpus or len(set(gpus)) != len(gpus) or min(gpus) < 0:
        raise ConfigError(f"--gpus {text!r}: expected distinct, non-negative GPU indices such as 0,1,2,3")
    return gpus


def slots(gpus: Sequence[int], per_trial: int) -> list[tuple[int, ...]]:
    """The listed GPUs in slots of ``per_trial``; GPUs that do not fill a slot are left out, loudly."""
    if per_trial < 1:
        raise ConfigError(f"--gpus-per-trial must be at least 1, got {per_trial}")
    if per_trial > len(gpus):
        raise ConfigError(f"--gpus-per-trial {per_trial} needs at least {per_trial} GPUs; --gpus lists {len(gpus)}")
    if len(gpus) % per_trial:
        raise ConfigError(f"--gpus lists {len(gpus)} GPUs, which do not divide into slots of {per_trial}")
    return [tuple(gpus[i : i + per_trial]) for i in range(0, len(gpus), per_trial)]


def busy_reason(reading: GpuReading, ours: Iterable[int]) -> str | None:
    """Why a GPU cannot take a trial now, or None when it is free."""
    own = set(ours)
    foreign = [(pid, used) for pid, used in reading.processes if pid not in own]
    if foreign:
        pid, used = max(foreign, key=lambda p: p[1])
        return f"GPU {reading.index} is busy: pid {pid}, not started by this tuner, holds {used / 2**30:.1f} GiB"
    if not reading.processes and reading.used_bytes > BUSY_BYTES:
        return f"GPU {reading.index} is busy: {reading.used_bytes / 2**30:.1f} GiB in use by processes not visible here"
    return None


def read_gpus(indices: Sequence[int]) -> list[GpuReading]:
    """The GPUs' memory and compute processes, through pynvml."""
    import pynvml

    pynvml.nvmlInit()
    try:
        readings = []
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            readings.append(GpuReading(
                index, name if isinstance(name, str) else name.decode(), int(memory.total), int(memory.used),
                tuple((int(p.pid), int(p.usedGpuMemory or 0)) for p in procs),
            ))  # fmt: skip
        return readings
    finally:
        pynvml.nvmlShutdown()


def visible_gpus() -> int:
    """How many GPUs pynvml sees (0 where the driver library is absent)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def slot_busy(
    slot: Sequence[int], ours: Iterable[int], reader: Callable[[Sequence[int]], list[GpuReading]] = read_gpus
) -> str | None:
    """The first reason a slot's GPUs cannot take a trial now, or None."""
    own = list(ours)
    for reading in reader(slot):
        reason = busy_reason(reading, own)
        if reason is not None:
            return reason
    return None
