"""What a trial is run with (``TrialContext``) and what it gives back (``TrialResult``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.driver import RequestRecord
from tuner.engines.base import Config, Device, EngineAdapter, LaunchSpec, ModelSpec
from tuner.engines.env import EngineEnv
from tuner.progress import Progress
from tuner.workloads.base import Workload

MAX_ERROR_RATE = 0.005
TTFT_AGREEMENT = 0.10  # client and server mean TTFT further apart than this: the trial is flagged
# Called with the number of measured requests and the boot time just before they are sent; returns
# the driver's on_record callback, which may raise ``Pruned`` to stop the workload (``tuner.pruning``).
WatchFactory = Callable[[int, float], Callable[[RequestRecord], None]]


@dataclass(frozen=True)
class TrialContext:
    engines: dict[str, tuple[EngineAdapter, EngineEnv]]
    model: ModelSpec
    device: Device
    workload: Workload
    log_dir: Path
    progress: Progress
    boot_deadline_s: float = 300.0
    slo: dict[str, float] = field(default_factory=dict)
    gpus: tuple[int, ...] | None = None  # this trial's GPUs (CUDA_VISIBLE_DEVICES); None: all, or the CPU


@dataclass
class TrialResult:
    config: Config
    launch: LaunchSpec
    engine_version: str
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    server: dict[str, float | None] = field(default_factory=dict)
    served_by: dict[str, Any] = field(default_factory=dict)
    peak_memory_bytes: int = 0  # device-wide on a GPU (another tenant's memory too)
    engine_gpu_peak_bytes: int | None = None  # the engine's own processes (GPU; None: unknown)
    boot_s: float | None = None
    log_path: str = ""
    log_tail: str = ""
    warnings: list[str] = field(default_factory=list)
    ttft_samples_ms: list[float] = field(default_factory=list)  # every successful request's, for CDFs
    request_log: list[dict[str, Any]] = field(default_factory=list)  # see request_log()
    phases_s: dict[str, float] = field(default_factory=dict)  # wall time of boot, warmup, drive, stress
    stress: dict[str, Any] | None = None  # the stress run's raw outcome (tuner.stress), when asked for
    pruned: dict[str, Any] | None = None  # where the pruner stopped the workload (tuner.pruning)
    memory_facts: dict[str, float] = field(default_factory=dict)  # the engine's own memory lines
    memory_estimate: dict[str, Any] | None = None  # what the screen predicted (tuner.memory)

    @property
    def ttft_p95_ms(self) -> float:
        return self.metrics.get("ttft_p95_ms", math.inf) if self.failure is None else math.inf

    @property
    def output_throughput_tok_s(self) -> float:
        return self.metrics.get("output_throughput_tok_s", 0.0) if self.failure is None else 0.0
