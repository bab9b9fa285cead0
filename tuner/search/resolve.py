"""Resolve what a search runs with: its engines and their environments, the device, the models
and the workload, and the study attributes that describe them."""

from __future__ import annotations

import dataclasses
import platform
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuner.engines import ADAPTERS, models
from tuner.engines.base import Device, EngineAdapter, ModelSpec
from tuner.engines.env import EngineEnv, probe, probe_named
from tuner.errors import ConfigError
from tuner.measure.capacity import check_slo
from tuner.measure.goodput import parse_slo
from tuner.measure.rate_steps import CapacityPlan
from tuner.measure.telemetry import gpu_device, gpu_visible
from tuner.progress import Progress
from tuner.search.options import SearchOptions
from tuner.search.scoring import is_capacity
from tuner.search.space import Space
from tuner.search.speculation import Offer, engines_at, study_offers
from tuner.study.cost import PRICE_ATTR
from tuner.workloads import source, workload_for_model
from tuner.workloads.base import TIER_NAMES, Slo, Workload
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
        if name in overrides:
            found[name] = (adapter, probe_named(adapter, overrides[name], "--engine-env"))
        elif name in space.engine_envs:
            found[name] = (adapter, probe_named(adapter, space.engine_envs[name], "the space's engine_envs:"))
        else:
            found[name] = (adapter, probe(adapter))
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


def resolve_offers(
    space: Space, engines: Mapping[str, tuple[EngineAdapter, EngineEnv]], model: ModelSpec, progress: Progress
) -> dict[str, Offer]:
    """What each engine may speculate with here; a listed method one cannot run is left out with one line."""
    p = space.parameters
    offers, notes = study_offers(p.methods(), p.named_drafts(), engines_at(engines), model)
    for note in notes:
        progress.line(note)
    return offers


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
        prefix_reuse=opts.prefix_reuse,
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
    capacity: CapacityPlan | None = None,
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
        "capacity_plan": None if capacity is None else capacity_attrs(capacity),
        **({PRICE_ATTR: opts.gpu_price} if opts.gpu_price is not None else {}),  # a resume without it keeps it
        # what a worker joining from another host needs to rebuild the very same workload and models
        "options": {
            "workload": opts.workload, "seed": opts.seed, "requests": opts.requests,
            "concurrency": opts.concurrency, "rate": opts.rate, "burstiness": opts.burstiness,
            "prefix_reuse": opts.prefix_reuse,
            "model": opts.model, "drafts": list(opts.drafts), "engines": list(engines),
        },
    }  # fmt: skip


TIERED_SLO = re.compile(r"^\s*(?P<tier>[a-z]+)\s*:(?P<bounds>.*)$")


def parse_slo_flags(texts: Sequence[str]) -> tuple[dict[str, float] | None, dict[str, dict[str, float]]]:
    """``--slo`` values: ``KEY=MS,...`` (one SLO) or ``TIER:KEY=MS,...`` (a capacity tier's); repeatable."""
    plain: dict[str, float] | None = None
    tiers: dict[str, dict[str, float]] = {}
    for text in texts:
        match = TIERED_SLO.match(text)
        if match is None:
            plain = {**(plain or {}), **parse_slo(text)}
            continue
        tier = match["tier"]
        if tier not in TIER_NAMES:
            raise ConfigError(f"--slo {text!r}: unknown tier {tier!r}; the tiers are {', '.join(TIER_NAMES)}")
        tiers[tier] = {**tiers.get(tier, {}), **parse_slo(match["bounds"])}
    return plain, tiers


def check_capacity_flags(opts: SearchOptions) -> None:
    """The capacity flags checked on their own, before any engine is probed: a bad tier or an SLO no
    request could meet is one line at once, not after a model was generated."""
    if not is_capacity(opts.objective):
        if opts.verify:
            raise ConfigError("--verify checks capacities: it needs a capacity objective")
        return
    if opts.tier not in TIER_NAMES:
        raise ConfigError(f"--tier {opts.tier!r}: expected one of {', '.join(TIER_NAMES)}")
    if opts.slo is not None and opts.objective != "capacity":
        raise ConfigError("--objective capacity-pareto scores two tiers: name each, --slo interactive:KEY=MS,...")
    given = {**opts.slo_tiers, **({opts.tier: opts.slo} if opts.slo is not None else {})}
    for name, slo in given.items():
        check_reachable(name, check_slo(slo))


def capacity_plan(opts: SearchOptions, workload: Workload, device: Device) -> CapacityPlan | None:
    """The capacity search every trial runs (None for the older objectives): the preset's tiers for
    this device, ``--slo`` over them, the step sizes for this device, resolved once here."""
    if not is_capacity(opts.objective):
        return None
    check_capacity_flags(opts)
    scored = (opts.tier,) if opts.objective == "capacity" else TIER_NAMES
    tiers = {name: _bounds(slo) for name, slo in workload.tiers.for_device(device.kind).items()}
    tiers.update(opts.slo_tiers)
    if opts.slo is not None:
        tiers[opts.tier] = dict(opts.slo)
    for name in scored:
        if not tiers.get(name):
            raise ConfigError(
                f"--objective {opts.objective} needs the {name} tier's SLO and workload {workload.name!r} has none: "
                f"give --slo {name}:ttft_p95_ms=...,tpot_p95_ms=..."
            )
        check_reachable(name, check_slo(tiers[name]))
    steps = CPU_STEPS if device.kind == "cpu" else GPU_STEPS
    burstiness = opts.burstiness or (workload.arrival.burstiness if workload.arrival.rate is not None else 1.0)
    if opts.confidence is not None:
        steps = {**steps, "confidence": opts.confidence}
    return CapacityPlan(
        tiers={name: tiers[name] for name in TIER_NAMES if name in tiers}, scored=tuple(scored),
        target=opts.attainment, resolution=opts.resolution, burstiness=burstiness, seed=opts.seed, **steps,
    )  # fmt: skip


# Step sizes per device. On the CPU build a boot costs a minute and a request seconds, so steps are
# short and the search starts low; on a GPU a step needs enough requests for a p95 of its own. A GPU
# search starts at the lowest rate whose minimum requests arrive within the minimum step time: below
# it a step waits for its requests to trickle in, and those slow first steps made the first search
# of an H200 study outlast its boot (reports/gpu-h200/capacity/block3). Lower capacities are still
# found: a search without an incumbent halves down from its start.
# A step is decided by its attainment's interval (tuner.measure.capacity), which needs requests: on the
# CPU build each request costs seconds, so its default looks twice at most and at a lower confidence
# than on a GPU: the Quickstart's whole study must stay within its minutes (--confidence sets either).
# Each device's max_steps lets a search without an incumbent climb from its start to a knee 32x above it
# and still halve the bracket to the resolution: with 8 on the CPU build, a drive of the CPU defaults ran
# out of steps on a bracket wider than the resolution (reports/capacity.md, "Capacity you can trust").
CPU_STEPS: dict[str, Any] = {"start_rate": 1.0, "min_step_s": 6.0, "min_requests": 12, "max_steps": 10,
                             "step_limit": 2, "confidence": 0.6}  # fmt: skip
GPU_STEPS: dict[str, Any] = {"start_rate": 40 / 15.0, "min_step_s": 15.0, "min_requests": 40, "max_steps": 10,
                             "step_limit": 3, "confidence": 0.9}  # fmt: skip
MIN_TTFT_MS = 1.0  # no server answers over HTTP within a millisecond


def check_reachable(tier: str, slo: Mapping[str, float]) -> None:
    """Refuse bounds no request could meet, before anything boots."""
    ttft, e2e = slo.get("ttft_p95_ms"), slo.get("e2e_p95_ms")
    if ttft is not None and ttft < MIN_TTFT_MS:
        raise ConfigError(f"--slo {tier}: ttft_p95_ms={ttft:g} is below {MIN_TTFT_MS:g} ms: no request could meet it")
    if ttft is not None and e2e is not None and e2e <= ttft:
        raise ConfigError(
            f"--slo {tier}: e2e_p95_ms={e2e:g} is not above ttft_p95_ms={ttft:g}: a request ends after its first token"
        )


def _bounds(slo: Slo) -> dict[str, float]:
    return {key: float(value) for key, value in slo.as_dict().items() if value is not None}


def capacity_attrs(plan: CapacityPlan) -> dict[str, Any]:
    """The plan as the study stores it: what every trial's capacity means, and what a worker reuses."""
    return {
        **dataclasses.asdict(plan),
        "tiers": {k: dict(v) for k, v in plan.tiers.items()},
        "scored": list(plan.scored),
    }
