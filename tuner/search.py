"""``tuner search``: resolve engines, models, device and workload, then run the Optuna study."""

from __future__ import annotations

import dataclasses
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from tuner import models
from tuner.engines import ADAPTERS
from tuner.engines.base import Device, EngineAdapter, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.errors import ConfigError
from tuner.finalists import run_finalists
from tuner.grid import grid_points, shuffled
from tuner.naming import safe_name
from tuner.objective import SearchObjective
from tuner.objectives import check_objective
from tuner.progress import Progress
from tuner.repeats import describe_verdict
from tuner.space import Space, load_space
from tuner.study import bind_study_attrs, enqueue_defaults, open_study, storage_url
from tuner.summary import trials_table
from tuner.telemetry import gpu_visible
from tuner.trial import TrialContext
from tuner.workloads import source, workload_for_model
from tuner.workloads.base import Workload
from tuner.workloads.trace import Trace

DEFAULT_TRIALS = 6


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
    log_dir: Path = Path("studies/logs")
    boot_deadline_s: float = 300.0
    objective: str = "pareto"
    slo: dict[str, float] | None = None  # None: the workload preset's default SLOs
    sampler: str = "tpe"
    screen: bool = True  # the pre-boot memory screen (tuner.memory)
    prune: bool = True  # stop trials clearly worse than the feasible ones so far (tuner.pruning)
    stress: bool = True  # the stress check of the finalists before a winner is named (tuner.stress)


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
    from tuner.telemetry import gpu_device

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


@dataclass(frozen=True)
class Budget:
    trials: int
    finalists: int
    repeats: int


def budget(opts: SearchOptions, device: Device) -> Budget:
    """Flags win; otherwise the embedded CPU default is sized to finish in about 10 minutes on 2 cores
    (every boot there costs 40-60 s), and everything else gets 6 trials and 3 finalists x 5 repeats."""
    small = device.kind == "cpu" and opts.model is None
    chosen = Budget(
        trials=opts.trials if opts.trials is not None else (4 if small else DEFAULT_TRIALS),
        finalists=opts.finalists if opts.finalists is not None else (1 if small else 3),
        # 5 from the noise benchmark (CV 6.5-11 % across fresh boots, reports/measurement.md); the
        # CPU quickstart keeps 2 to fit its time, so its verdicts are mostly honest ties.
        repeats=opts.repeats if opts.repeats is not None else (2 if small else 5),
    )
    if chosen.trials < 1 or chosen.finalists < 0 or chosen.repeats < 0:
        raise ConfigError("--trials must be at least 1, and --finalists and --repeats at least 0")
    return chosen


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
    }


MAX_TRIALS_PER_BOOT = 4  # screened configs are free, but a space that is all infeasible must still end


def run_until_booted(study: optuna.Study, objective: SearchObjective, boots: int, timeout_s: float | None) -> None:
    """Run trials until ``boots`` of them booted an engine (screened ones do not count), the
    timeout passes, or MAX_TRIALS_PER_BOOT x ``boots`` trials were made."""

    def enough(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        if objective.boots >= boots:
            study.stop()

    study.optimize(objective, n_trials=boots * MAX_TRIALS_PER_BOOT, timeout=timeout_s, callbacks=[enough])


def enqueue_grid(study: optuna.Study, space: Space, engines: list[str], drafts: list[str], seed: int) -> None:
    """``--sampler grid``: every distinct config not yet in the study, in a seeded order."""
    done = [t.params or t.system_attrs.get("fixed_params", {}) for t in study.get_trials(deepcopy=False)]
    for point in shuffled(grid_points(space, engines, drafts), seed):
        if point not in done:
            study.enqueue_trial(point, user_attrs={"config_kind": "sampled"})


def free_memory(device: Device) -> Callable[[], int | None]:
    """The GPU's free bytes at the moment a trial is screened (None on the CPU build)."""
    if device.kind == "cpu":
        return lambda: None
    from tuner.telemetry import gpu_free_bytes

    return gpu_free_bytes


def run_search(opts: SearchOptions, progress: Progress) -> optuna.Study:
    if opts.trials is not None and opts.trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {opts.trials}")
    given = source(opts.workload)  # a bad preset name or trace file fails before any engine is probed
    space = load_space(opts.space)
    engines = resolve_engines(space, opts.engine_envs, opts.engines, progress)
    first_env = next(iter(engines.values()))[1]
    device = detect_device(first_env, space)
    plan = budget(opts, device)
    model = resolve_models(opts, space, first_env)
    workload = resolve_workload(opts, model, given)
    slo = opts.slo if opts.slo is not None else preset_slo(workload)
    check_objective(opts.objective, slo)
    name = opts.study or f"{workload.name}-{'-'.join(engines)}"
    study = open_study(name, storage_url(name, opts.storage), opts.seed, opts.objective, opts.sampler)
    bind_study_attrs(study, study_attrs(opts, space, engines, device, model, workload, slo))
    enqueue_defaults(study, list(engines))
    if opts.sampler == "grid":
        enqueue_grid(study, space, list(engines), list(model.drafts), opts.seed)
    log_dir = opts.log_dir.resolve() / safe_name(name)
    ctx = TrialContext(engines, model, device, workload, log_dir, progress, opts.boot_deadline_s, slo)
    progress.line(
        f"study {name!r}: {plan.trials} trials, then {plan.finalists} finalists x {plan.repeats} repeats, "
        f"on {device.name}; workload {workload.name} ({workload.description})"
    )

    objective = SearchObjective(
        study, space, ctx, opts.objective, screen=opts.screen, prune=opts.prune, free_memory=free_memory(device)
    )
    run_until_booted(study, objective, plan.trials, opts.timeout_s)
    if plan.repeats > 0 or opts.stress:
        progress.line(
            f"finalists: {plan.finalists} best feasible configs and the engine default, {plan.repeats} fresh boots each"
            + (", the last with the stress check" if opts.stress else "")
        )
        verdict = run_finalists(study, plan.finalists, plan.repeats, ctx, space.static.enforce_eager, opts.stress)
        progress.line(describe_verdict(verdict))
    progress.line(trials_table(study))
    return study
