"""Device memory sampled through a trial, for the peak.

On an NVIDIA GPU the reading is pynvml's used memory summed over the visible devices: what decides
whether the next allocation fits, another tenant's memory included. Beside it the sampler keeps the
engine's own share, the compute processes pynvml lists that belong to the engine's process tree
(unknown, None, where pynvml's pids are another namespace's and none matches). On the CPU build the
reading is the resident memory of the engine's whole process tree: the KV cache, weights and
activations all live there.
"""

from __future__ import annotations

import threading
from types import TracebackType

import psutil

from tuner.engines.base import Device
from tuner.errors import EnvironmentSetupError

SAMPLE_EVERY_S = 0.5


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def process_tree_pids(pid: int) -> set[int]:
    return {proc.pid for proc in _tree(pid)}


def process_tree_rss(pid: int) -> int:
    procs = _tree(pid)
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass  # a worker that exited between listing and reading
    return total


def gpu_reading(indices: list[int] | None = None, pids: set[int] | None = None) -> tuple[int, int | None]:
    """In one pynvml session: the used memory of the GPUs ``indices`` (all: None) and, given ``pids``
    (the engine's tree), what pynvml's compute processes of those pids hold (None when none is listed)."""
    import pynvml  # nvidia-ml-py; only on GPU hosts is the library behind it present

    pynvml.nvmlInit()
    try:
        chosen = indices if indices is not None else list(range(pynvml.nvmlDeviceGetCount()))
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in chosen]
        used = sum(int(pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in handles)
        if pids is None:
            return used, None
        try:
            mine = [int(proc.usedGpuMemory or 0) for h in handles
                    for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(h) if proc.pid in pids]  # fmt: skip
        except pynvml.NVMLError:  # a GPU (or MIG slice) that lists no processes: the device's reading stands
            return used, None
        return used, (sum(mine) if mine else None)
    finally:
        pynvml.nvmlShutdown()


def gpu_used_bytes(indices: list[int] | None = None) -> int:
    return gpu_reading(indices)[0]


def gpu_process_bytes(pids: set[int], indices: list[int] | None = None) -> int | None:
    """GPU memory held by the processes ``pids``; None when none of them is listed."""
    return gpu_reading(indices, pids)[1]


def gpu_free_bytes(index: int = 0) -> int | None:
    """Free memory of one GPU now (None when pynvml cannot read it): vLLM refuses to start when it
    is below its memory fraction's share, which the memory screen checks before booting."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index)).free)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


class MemorySampler:
    """A background thread that keeps the peak of ``read()`` until the ``with`` block ends."""

    def __init__(self, device_kind: str, pid: int, gpus: tuple[int, ...] | None = None) -> None:
        self._device_kind = device_kind
        self._pid = pid
        self._gpus = list(gpus) if gpus is not None else None  # a slot's GPUs: the others are not its
        self.peak_bytes = 0
        self.engine_peak_bytes: int | None = None  # GPU only: the engine's own processes' share
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memory-sampler", daemon=True)

    def read(self) -> tuple[int, int | None]:
        """(the device's reading, the engine's own GPU share or None) now."""
        if self._device_kind == "cpu":
            return process_tree_rss(self._pid), None
        return gpu_reading(self._gpus, process_tree_pids(self._pid))

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                used, engine = self.read()
                self.peak_bytes = max(self.peak_bytes, used)
                if engine is not None:
                    self.engine_peak_bytes = max(self.engine_peak_bytes or 0, engine)
            except Exception:  # noqa: BLE001 - a failed reading must never fail the trial
                pass
            self._stop.wait(SAMPLE_EVERY_S)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def gpu_device() -> Device:
    """The first visible NVIDIA GPU, read through pynvml."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise EnvironmentSetupError(f"the engine is a GPU build but no NVIDIA GPU is readable: {exc}") from exc
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    finally:
        pynvml.nvmlShutdown()
    return Device("cuda", name if isinstance(name, str) else name.decode(), total)


def gpu_visible() -> bool:
    """Whether pynvml sees at least one NVIDIA GPU (False where the driver library is absent)."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    try:
        return int(pynvml.nvmlDeviceGetCount()) > 0
    finally:
        pynvml.nvmlShutdown()
