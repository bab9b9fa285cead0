"""``tuner search``: resolve engines, models, device and workload, then run the Optuna study."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from tuner import models
from tuner.engines import ADAPTERS
from tuner.engines.base import Device, EngineAdapter, ModelSpec
from tuner.engines.env import EngineEnv, probe
from tuner.errors import ConfigError
from tuner.naming import safe_name
from tuner.progress import Progress
from tuner.space import Space, load_space, suggest
from tuner.study import DEFAULT_KIND, bind_study_attrs, enqueue_defaults, open_study, record, storage_url
from tuner.summary import trials_table
from tuner.telemetry import gpu_visible
from tuner.trial import TrialContext, run_trial
from tuner.workloads import build_workload
from tuner.workloads.base import Workload, load_tokenizer

DEFAULT_TRIALS = 6


@dataclass
class SearchOptions:
    workload: str
    space: Path | None = None
    study: str | None = None
    storage: str | None = None
    trials: int = DEFAULT_TRIALS
    timeout_s: float | None = None
    model: str | None = None
    drafts: list[str] = field(default_factory=list)
    seed: int = 0
    engine_envs: dict[str, str] = field(default_factory=dict)
    engines: list[str] | None = None
    requests: int = 16
    concurrency: int | None = None
    log_dir: Path = Path("studies/logs")
    boot_deadline_s: float = 300.0


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
    return models.user_models(opts.model, opts.drafts, space.static.max_model_len)


def resolve_workload(opts: SearchOptions, model: ModelSpec) -> Workload:
    tokenizer = load_tokenizer(Path(model.path))
    return build_workload(
        opts.workload,
        tokenizer,
        seed=opts.seed,
        n_requests=opts.requests,
        max_model_len=model.max_model_len,
        concurrency=opts.concurrency,
    )


def run_search(opts: SearchOptions, progress: Progress) -> optuna.Study:
    if opts.trials < 1:
        raise ConfigError(f"--trials must be at least 1, got {opts.trials}")
    space = load_space(opts.space)
    engines = resolve_engines(space, opts.engine_envs, opts.engines, progress)
    first_env = next(iter(engines.values()))[1]
    device = detect_device(first_env, space)
    model = resolve_models(opts, space, first_env)
    workload = resolve_workload(opts, model)
    name = opts.study or f"{opts.workload}-{'-'.join(engines)}"
    study = open_study(name, storage_url(name, opts.storage), opts.seed)
    bind_study_attrs(
        study,
        {
            "workload": workload.name,
            "workload_digest": workload.digest(),
            "model": model.path,
            "drafts": dict(model.drafts),
            "hardware": {"kind": device.kind, "name": device.name, "memory_bytes": device.memory_bytes},
            "engines": {n: {"distribution": e.distribution, "version": e.version} for n, (_, e) in engines.items()},
            "space": space.model_dump(),
        },
    )
    enqueue_defaults(study, list(engines))
    log_dir = opts.log_dir.resolve() / safe_name(name)
    ctx = TrialContext(engines, model, device, workload, log_dir, progress, opts.boot_deadline_s)
    progress.line(
        f"study {name!r}: {opts.trials} trials on {device.name}, workload {workload.name} ({workload.description})"
    )

    def objective(trial: optuna.Trial) -> tuple[float, float]:
        is_default = trial.user_attrs.get("config_kind") == DEFAULT_KIND
        if not is_default:
            trial.set_user_attr("config_kind", "sampled")
        config = suggest(trial, space, list(engines), list(model.drafts), is_default)
        return record(trial, run_trial(trial.number, config, ctx))

    study.optimize(objective, n_trials=opts.trials, timeout=opts.timeout_s)
    progress.line(trials_table(study))
    return study
