"""What ``tuner search`` and ``tuner worker`` are asked to do, and the budget they get."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tuner.engines.base import Device
from tuner.errors import ConfigError
from tuner.measure.capacity import ATTAINMENT_TARGET, RESOLUTION
from tuner.search.samplers import default_sampler
from tuner.study.objectives import DEFAULT_OBJECTIVE
from tuner.workloads.base import DEFAULT_TIER


@dataclass
class SearchOptions:
    workload: str
    space: Path | None = None
    study: str | None = None
    storage: str | None = None
    trials: int | None = None  # None: see budget()
    finalists: int | None = None
    repeats: int | None = None
    timeout_s: float | None = None
    model: str | None = None
    drafts: list[str] = field(default_factory=list)
    seed: int = 0
    engine_envs: dict[str, str] = field(default_factory=dict)
    engines: list[str] | None = None
    requests: int | None = None  # None: a preset's default_requests, the whole file for a trace
    concurrency: int | None = None
    rate: float | None = None  # open loop at this many requests (or sessions) per second
    burstiness: float | None = None
    prefix_reuse: float | None = None  # --prefix-reuse: None, the preset's own share
    verify: bool = False  # --verify: each tier's winner checked by the engine's own client at the end
    log_dir: Path = Path("studies/logs")
    boot_deadline_s: float = 300.0
    objective: str = DEFAULT_OBJECTIVE
    slo: dict[str, float] | None = None  # None: the workload preset's default SLOs (capacity: the scored tier's)
    slo_tiers: dict[str, dict[str, float]] = field(default_factory=dict)  # --slo TIER:...: a capacity tier's SLO
    tier: str = DEFAULT_TIER  # --objective capacity scores this tier
    attainment: float = ATTAINMENT_TARGET  # the share of requests that must meet the SLO at a capacity
    resolution: float = RESOLUTION  # the capacity search's relative precision
    confidence: float | None = None  # how sure a step's decision must be (None: the device's default)
    gpu_price: float | None = None  # USD per GPU-hour: capacities priced per million output tokens
    sampler: str | None = None  # --sampler; None: the objective's default (see sampler_name)
    screen: bool = True  # the pre-boot memory screen (tuner.search.memory)
    prune: bool = True  # stop trials clearly worse than the feasible ones so far (tuner.search.pruning)
    stress: bool = True  # the stress check of the finalists before a winner is named (tuner.measure.stress)
    gpus: list[int] | None = None  # --gpus: the GPUs this host may use, cut into slots
    gpus_per_trial: int = 1
    worker: bool = False  # tuner worker: a fleet member (server database, no finalists)
    space_dump: dict[str, Any] | None = None  # a worker joining a study: the study's own space

    def sampler_name(self) -> str:
        """The sampler the study runs: ``--sampler``, else the objective's default."""
        return self.sampler or default_sampler(self.objective)


@dataclass(frozen=True)
class Plan:
    trials: int
    finalists: int
    repeats: int


# The budgets without flags. The repeats follow from the noise benchmark (the spread across fresh
# boots, reports/measurement.md). The embedded CPU default (the generated models on the CPU build) is
# sized to finish within the Quickstart's 10 minutes on 2 cores (reports/quickstart.md): its one
# repeat makes the verdict a tie for too few runs, and it says so.
DEFAULT_PLAN = Plan(trials=6, finalists=3, repeats=5)
CPU_DEFAULT_PLAN = Plan(trials=3, finalists=1, repeats=1)


def plan_of(opts: SearchOptions, device: Device) -> Plan:
    """Flags win; otherwise ``CPU_DEFAULT_PLAN`` for the embedded CPU default, ``DEFAULT_PLAN`` else."""
    default = CPU_DEFAULT_PLAN if device.kind == "cpu" and opts.model is None else DEFAULT_PLAN
    chosen = Plan(
        trials=opts.trials if opts.trials is not None else default.trials,
        finalists=opts.finalists if opts.finalists is not None else default.finalists,
        repeats=opts.repeats if opts.repeats is not None else default.repeats,
    )
    if chosen.trials < 0 or chosen.finalists < 0 or chosen.repeats < 0:
        raise ConfigError("--trials, --finalists and --repeats must be at least 0")
    return chosen
