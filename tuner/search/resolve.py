"""Resolve what a search runs with: its engines and their environments, the device, the models
and the workload, and the study attributes that describe them."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

from tuner.engines import ADAPTERS, models
from tuner.engines.base import Device, EngineAdapter, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.errors import ConfigError
from tuner.measure.telemetry import gpu_device, gpu_visible
from tuner.progress import Progress
from tuner.search.options import SearchOptions
from tuner.search.space import Space
from tuner.workloads import source, workload_for_model
from tuner.workloads.base import Workload
from tuner.workloads.trace import Trace


def resolve_engines(
    space: Space, overrides: dict[str, str], explicit: list[str] | None, progress: Progress
) -> dict[str, tuple[EngineAdapter, EngineEnv]]:
    """The engines this study runs: an engine that cannot run here is left out with one line,
    unless the user asked for it by name, which is then a configuration error."""
    for name in explicit or []:
        if name not in ADAPTERS:
            raise ConfigError(f"--engines: unknown engine {name!r}; known: {', '.join(ADAPTERS)}")
    found = {}
    for name in explicit or space.engines:
        adapter = ADAPTERS[name]()
        if adapter.needs_gpu and not gpu_visible():
            if explicit:
                raise ConfigError(f"--engines {name}: {name} needs an NVIDIA GPU and none is visible here")
            progress.line(f"{name}: left out of this study: it needs an NVIDIA GPU and none is visible here")
            continue
        where = overrides.get(name) or space.engine_envs.get(name)
        found[name] = (adapter, probe(adapter, Path(where) if where else None))
    if not found:
        raise ConfigError("no engine of the search space can run on this machine")
    return found


def detect_device(env: EngineEnv, space: Space) -> Device:
    if env.is_cpu_build:
        budget = space.static.cpu_memory_budget_mib * 2**20
        return Device("cpu", f"{platform.machine()} CPU ({env.distribution})", budget)

    return gpu_device()


def resolve_models(opts: SearchOptions, space: Space, env: EngineEnv) -> ModelSpec:
    if opts.model is None:
        if opts.drafts:
            raise ConfigError("--draft-model needs --model: the generated default target has its own drafts")
        return models.default_models(env.python, space.static.max_model_len)
    return models.user_models(opts.model, opts.drafts, space.static.max_model_len, space.static.load_format)


def resolve_workload(opts: SearchOptions, model: ModelSpec, given: str | Trace | None = None) -> Workload:
    """The preset or trace ``opts.workload`` names (``given``: already parsed) for the model."""
    return workload_for_model(
        source(opts.workload) if given is None else given,
        Path(model.path),
        seed=opts.seed,
        n_requests=opts.requests,
        max_model_len=model.max_model_len,
        concurrency=opts.concurrency,
        rate=opts.rate,
        burstiness=opts.burstiness,
    )


def preset_slo(workload: Workload) -> dict[str, float]:
    """The preset's default SLOs as a dict of the bounds it sets (none: an empty dict)."""
    slo = getattr(workload, "slo", None)
    if slo is None:
        return {}
    return {k: float(v) for k, v in dataclasses.asdict(slo).items() if v is not None}


def study_attrs(
    opts: SearchOptions,
    space: Space,
    engines: dict[str, tuple[EngineAdapter, EngineEnv]],
    device: Device,
    model: ModelSpec,
    workload: Workload,
    slo: dict[str, float],
) -> dict[str, object]:
    return {
        "workload": workload.name,
        "workload_digest": workload.digest(),
        "model": model.path,
        "drafts": dict(model.drafts),
        "hardware": {"kind": device.kind, "name": device.name, "memory_bytes": device.memory_bytes},
        "engines": {n: {"distribution": e.distribution, "version": e.version} for n, (_, e) in engines.items()},
        "space": space.model_dump(),
        "objective": opts.objective,
        "slo": slo,
        # what a worker joining from another host needs to rebuild the very same workload and models
        "options": {
            "workload": opts.workload, "seed": opts.seed, "requests": opts.requests,
            "concurrency": opts.concurrency, "rate": opts.rate, "burstiness": opts.burstiness,
            "model": opts.model, "drafts": list(opts.drafts), "engines": list(engines),
        },
    }  # fmt: skip
