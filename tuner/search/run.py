"""``tuner search`` and ``tuner worker``: resolve everything a trial needs, then run the study.

The trials run in ``tuner.fleet.loop`` (one slot, or one per GPU slot), under the protocol of
``tuner.fleet.loop``; then, for ``search``, the finalists' repeats and stress check (``tuner.search.finalists``).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import optuna
import psutil
import sqlalchemy.exc

from tuner.engines.base import Device
from tuner.errors import ConfigError, StorageError
from tuner.fleet.loop import Budget, Reservation, Slot, heartbeat_storage, reclaim, run_slots, sole_process
from tuner.fleet.placement import slot_busy, slots, visible_gpus
from tuner.measure.rate_steps import CapacityPlan
from tuner.measure.telemetry import gpu_free_bytes
from tuner.measure.trial import TrialContext
from tuner.naming import safe_name
from tuner.progress import Progress
from tuner.report.trials_table import trials_table
from tuner.search.enqueue import enqueued_points
from tuner.search.finalists import deciders, run_finalists
from tuner.search.grid import grid_points, shuffled
from tuner.search.model.sampler import ModelSampler, context_of
from tuner.search.objective import SearchObjective
from tuner.search.options import Plan, SearchOptions, plan_of
from tuner.search.resolve import (
    capacity_plan,
    check_capacity_flags,
    detect_device,
    preset_slo,
    resolve_engines,
    resolve_models,
    resolve_offers,
    resolve_workload,
    study_attrs,
)
from tuner.search.samplers import make_sampler, resumed_seed
from tuner.search.scoring import check_objective, directions
from tuner.search.space import Space, check_space_fits, load_space
from tuner.search.speculation import Offer
from tuner.search.verify_server import verify_winners
from tuner.study.attrs import (
    SAMPLED_KIND,
    TrialAttrs,
    bind_study_attrs,
    checked_trial_attrs,
    enqueue_configs,
    enqueue_defaults,
)
from tuner.study.storage import open_study, storage_url
from tuner.study.verdict import describe_verdict
from tuner.workloads import source
from tuner.workloads.base import Workload

__all__ = [
    "Plan", "SearchOptions", "detect_device", "plan_of", "preset_slo", "resolve_engines", "resolve_models",
    "resolve_workload", "run_search", "study_attrs",
]  # fmt: skip


def enqueue_grid(study: optuna.Study, space: Space, offers: Mapping[str, Offer], seed: int) -> None:
    """``--sampler grid``: every distinct config not yet in the study, in a seeded order."""
    done = [t.params or t.system_attrs.get("fixed_params", {}) for t in study.get_trials(deepcopy=False)]
    kind = checked_trial_attrs(TrialAttrs(config_kind=SAMPLED_KIND))
    for point in shuffled(grid_points(space, offers), seed):
        if point not in done:
            study.enqueue_trial(point, user_attrs=kind)


def free_memory(device: Device, gpu: int = 0) -> Callable[[], int | None]:
    """The GPU's free bytes at the moment a trial is screened (None on the CPU build)."""
    if device.kind == "cpu":
        return lambda: None

    return lambda: gpu_free_bytes(gpu)


def make_slots(ctx: TrialContext, opts: SearchOptions) -> list[Slot]:
    """One slot without ``--gpus``; else one per ``--gpus-per-trial`` GPUs, each checked before its trials."""
    if not opts.gpus:
        return [Slot(ctx)]

    out = []
    for gpus in slots(opts.gpus, opts.gpus_per_trial):
        out.append(Slot(replace(ctx, gpus=gpus), gpus, partial(lambda g: slot_busy(g, our_pids()), gpus)))
    return out


def our_pids() -> list[int]:
    """The processes this tuner started (engines and their workers)."""

    return [p.pid for p in psutil.Process().children(recursive=True)]


def open_for(opts: SearchOptions, name: str, url: str) -> optuna.Study:
    """The study, on a storage that keeps heartbeats where it is a database (workers retry lost trials)."""
    storage: str | optuna.storages.BaseStorage = url
    if url.split(":", 1)[0].split("+")[0] in ("sqlite", "postgresql", "mysql"):
        try:
            storage = heartbeat_storage(url)
        except (sqlalchemy.exc.SQLAlchemyError, ValueError, ImportError) as exc:
            raise StorageError(f"cannot open {url}: {str(exc).splitlines()[0]}") from exc
    study = open_study(name, storage, directions(opts.objective), make_sampler(opts.sampler_name(), opts.seed))
    process = f"{socket.gethostname()}/{os.getpid()}" if opts.worker else ""
    seed = resumed_seed(opts.seed, len(study.get_trials(deepcopy=False)), process)
    if seed != opts.seed:  # resumed, or a worker: not the draws the sampler made before (resumed_seed)
        study.sampler = make_sampler(opts.sampler_name(), seed)
    return study


def run_search(opts: SearchOptions, progress: Progress) -> optuna.Study:
    """``tuner search`` and ``tuner worker``: resolve the engines, device, models, workload and plan,
    open (or resume) the study, run its trial budget, then (not as a worker) the finalists' repeats,
    the stress check, the verdict and, with ``--verify``, each tier's winner checked by the engine's
    own client. Returns the study."""
    if opts.trials is not None and opts.trials < 0:
        raise ConfigError(f"--trials must be at least 0, got {opts.trials}")
    given = source(opts.workload)  # a bad preset name or trace file fails before any engine is probed
    check_capacity_flags(opts)
    space = Space.model_validate(opts.space_dump) if opts.space_dump else load_space(opts.space)
    engines = resolve_engines(space, opts.engine_envs, opts.engines, progress)
    first_env = next(iter(engines.values()))[1]
    device = detect_device(first_env, space)
    plan = plan_of(opts, device)
    check_parallel(space, opts, device)
    model = resolve_models(opts, space, first_env)
    offers = resolve_offers(space, engines, model, progress)
    enqueued, left_out = enqueued_points(space, offers)  # a draft that serves no entry's method fails here
    for line in left_out:
        progress.line(line)
    workload = resolve_workload(opts, model, given)
    capacity = capacity_plan(opts, workload, device)
    if opts.sampler_name() == "model" and capacity is None:
        raise ConfigError("--sampler model predicts capacity: use --objective capacity or capacity-pareto")
    if capacity is not None:
        slo = dict(capacity.tiers[capacity.scored[0]])  # what the stress check and goodput judge against
    else:
        slo = opts.slo if opts.slo is not None else preset_slo(workload)
        check_objective(opts.objective, slo)
    name = opts.study or f"{workload.name}-{'-'.join(engines)}"
    url = storage_url(name, opts.storage)
    if opts.worker and url.startswith("sqlite"):
        raise ConfigError("tuner worker needs a database many processes can share: --storage postgresql://user@host/db")
    with sole_process(url, name):
        study = open_for(opts, name, url)
        check_space_fits(study, space, offers)  # before any attr or trial is written
        bind_study_attrs(study, study_attrs(opts, space, engines, device, model, workload, slo, capacity))
        if url.startswith("sqlite") and (lost := reclaim(study)):
            progress.line(f"{lost} trial(s) left running by an earlier run that stopped: marked FAIL and queued again")
        lock = Reservation(url, name)
        with lock.held():  # workers starting together enqueue the defaults, the space's configs (and the grid) once
            enqueue_defaults(study, list(engines))
            enqueue_configs(study, enqueued)
            if opts.sampler_name() == "grid":
                enqueue_grid(study, space, offers, opts.seed)
        log_dir = opts.log_dir.resolve() / safe_name(name)
        ctx = TrialContext(
            engines, model, device, workload, log_dir, progress, opts.boot_deadline_s, slo, None, capacity
        )
        if isinstance(study.sampler, ModelSampler):
            study.sampler.bind(context_of(space, ctx, offers))
        progress.line(
            f"study {name!r}: {plan.trials} booted trials in all, then {plan.finalists} finalists x {plan.repeats} "
            f"repeats, on {device.name}; workload {workload.name} ({_described(workload, capacity)})"
        )
        objective = SearchObjective(study, space, ctx, opts.objective, opts.screen, opts.prune,
                                    free_memory=free_memory(device, (opts.gpus or [0])[0]), offers=offers)  # fmt: skip
        deadline = None if opts.timeout_s is None else time.monotonic() + opts.timeout_s
        run_slots(study, objective, Budget(plan.trials, deadline), lock, make_slots(ctx, opts))
        if not opts.worker and (plan.repeats > 0 or opts.stress):
            _finalists(study, plan, ctx, space, opts.stress)
        if opts.verify and not opts.worker and capacity is not None:
            verify_winners(study, opts, capacity.scored, progress, log_dir / "verify")
    progress.line(trials_table(study))
    return study


def _finalists(study: optuna.Study, plan: Plan, ctx: TrialContext, space: Space, stress: bool) -> None:
    ctx.progress.line(
        f"finalists: the {plan.finalists} best feasible configs by {' and by '.join(deciders(study))}, and each "
        f"engine's default, {plan.repeats} fresh boots each" + (", the last with the stress check" if stress else "")
    )
    verdict = run_finalists(study, plan.finalists, plan.repeats, ctx, space.static.enforce_eager, stress)
    ctx.progress.line(describe_verdict(verdict))


def check_parallel(space: Space, opts: SearchOptions, device: Device) -> None:
    """Tensor parallelism is bounded by the GPUs a trial gets, and needs GPUs at all."""
    if opts.gpus and device.kind == "cpu":
        raise ConfigError("--gpus needs NVIDIA GPUs: this engine is a CPU build (or no GPU is visible)")
    if opts.gpus:
        missing = sorted(set(opts.gpus) - set(range(visible_gpus())))
        if missing:
            raise ConfigError(
                f"--gpus {','.join(map(str, opts.gpus))}: no GPU {missing[0]} here ({visible_gpus()} visible)"
            )
    tp = space.parameters.tensor_parallel
    widest = max(tp.choices) if tp is not None else 1
    if widest > 1 and device.kind == "cpu":
        raise ConfigError("tensor_parallel above 1 needs GPUs: the CPU build runs one engine process")
    if widest > opts.gpus_per_trial:
        raise ConfigError(f"tensor_parallel choices go up to {widest}: give --gpus-per-trial {widest} (and --gpus)")


def _described(workload: Workload, capacity: CapacityPlan | None) -> str:
    """The workload, and what a trial does with it: one drive, or a capacity search per scored tier."""
    if capacity is None:
        return workload.description
    drafted = workload.description.split("; ")[0]
    tiers = "; ".join(
        f"{tier} tier " + ", ".join(f"{k} <= {v:g}" for k, v in capacity.tiers[tier].items())
        for tier in capacity.scored
    )
    return f"{drafted}; capacity at {capacity.target:.0%} attainment of the {tiers}"
