"""``tuner plan``: the exact commands N trials would start, sampled from the space; boots nothing.

It works for every engine on any machine (SGLang on a machine without a GPU included): where an
engine's environment is missing, the argv names plain ``python3`` and the newest version the adapter
supports, and the device is taken to be a GPU: the one given (``--gpu-memory``, to plan here for a
GPU of another machine), else the one visible here, else one of unknown memory (the engines'
defaults that grow with a GPU's memory, such as a sequence limit or a token budget, then take their
smallest values). ``--engine-version ENGINE=VERSION`` plans for another supported version the same
way. The port is the engine's default one. A speculative method the space lists that an engine, its
version, its environment or the model cannot run is left out of that engine's space with one line
(``say``) saying why, and so is each sampled config the engine at that version refuses on that
device (``EngineAdapter.refusal``: its validation, or a known death at boot); another is sampled in
its place, so every row printed is one the engine accepts as far as its adapter knows. With a
``study``, a config its own trials tell without a boot (``tuner.search.learned``: rejected like an
earlier config for its draft slots, or speculating with a draft measured idle) is left out the same
way, with one line naming the trial: a search of that study would not boot it.

The space's ``enqueue:`` configs come first, each row's ``kind`` ``enqueued`` (``sampled`` for the
rest), as a search boots them right after the engine defaults; ``n`` counts the sampled rows only.
With a ``study`` every row carries its predicted capacity, and the sampled rows are ranked by it: the
enqueued ones boot first whatever they predict, so they keep their order.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna

from tuner.engines import ADAPTERS, models
from tuner.engines.base import Device, EngineAdapter, ModelSpec
from tuner.engines.env import EngineEnv, probe, probe_named
from tuner.errors import ConfigError, EnvironmentSetupError
from tuner.measure.telemetry import gpu_device, gpu_visible
from tuner.search.acceptance import MEASURED_STATES
from tuner.search.enqueue import enqueued_points
from tuner.search.learned import learned_screen
from tuner.search.model.ranking import by_prediction, predict_rows
from tuner.search.resolve import detect_device
from tuner.search.space import Space, load_space, suggest
from tuner.search.speculation import EngineAt, study_offers
from tuner.study.attrs import ENQUEUED_KIND, SAMPLED_KIND

PLANNED_GPU = Device("cuda", "NVIDIA GPU (planned)", 0)  # memory unknown: the adapters' smallest defaults
DRAWS_PER_ROW = 20  # a space the engine refuses almost everywhere ends the plan short instead of never


def _env_or_none(adapter: EngineAdapter, where: str | None) -> EngineEnv | None:
    try:
        return probe(adapter, Path(where) if where else None)
    except EnvironmentSetupError:
        return None


def _model(space: Space, model: str | None, drafts: list[str]) -> ModelSpec:
    if model is not None:
        return models.user_models(model, drafts, space.static.max_model_len, space.static.load_format)
    return models.default_model_paths(space.static.max_model_len)


def plan(
    space_path: Path | None,
    engines: list[str] | None,
    n: int,
    seed: int,
    model: str | None = None,
    drafts: list[str] | None = None,
    engine_envs: dict[str, str] | None = None,
    study: optuna.Study | None = None,
    versions: dict[str, str] | None = None,
    say: Callable[[str], None] = lambda line: None,
    gpu: Device | None = None,
) -> list[dict[str, Any]]:
    """The space's enqueued configs' launches, then ``n`` sampled ones'; with a capacity ``study``
    that has served trials, each with the capacity its model predicts (``tuner.search.model.ranking``),
    the sampled ones highest first. ``gpu``: the GPU planned for (default: the one
    visible here, else one of unknown memory); an engine installed here as a CPU build is planned
    for this machine's CPU whatever it says."""
    if n < 1:
        raise ConfigError(f"--n must be at least 1, got {n}")
    space = load_space(space_path)
    names = engines or space.engines
    for name in names:
        if name not in ADAPTERS:
            raise ConfigError(f"--engines: unknown engine {name!r}; known: {', '.join(ADAPTERS)}")
    spec = _model(space, model, drafts or [])
    targets = {name: _target(name, space, engine_envs or {}, (versions or {}).get(name)) for name in names}
    at: dict[str, EngineAt] = {
        name: (adapter, env.version if env else version, env.modules if env else None)
        for name, (adapter, env, version) in targets.items()
    }
    offers, notes = study_offers(space.parameters.methods(), space.parameters.named_drafts(), at, spec)
    for note in notes:
        say(note)
    points, left_out = enqueued_points(space, offers)
    for note in left_out:
        say(note)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampling = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for point in points:  # read back through suggest, as a search trial reads them
        sampling.enqueue_trial(point)
    gpu = gpu or _gpu()
    ran = [] if study is None else study.get_trials(deepcopy=False, states=MEASURED_STATES)

    def launch_row(kind: str) -> dict[str, Any] | None:
        """The next trial's config as a row, or None where the engine refuses it or the study tells it."""
        trial = sampling.ask()
        config = suggest(trial, space, offers, is_default=False)
        sampling.tell(trial, 0.0)
        adapter, env, version = targets[config.engine]
        device = detect_device(env, space) if env is not None and env.is_cpu_build else gpu
        refused = adapter.refusal(config.params, device, version, config.enforce_eager)
        if refused is not None:
            say(f"{config.engine} {version}: left out {json.dumps(dict(config.params))}: {refused}")
            return None
        learned = learned_screen(config, ran, adapter) if ran else None
        if learned is not None:
            params = json.dumps(dict(config.params))
            say(f"{config.engine} {version}: left out {params}: the study would not boot it: {learned.why}")
            return None
        python = env.python if env is not None else "python3"
        launch = adapter.launch(config, spec, device, adapter.default_port, python, version)
        return {"engine": config.engine, "engine_version": version, "kind": kind, "params": dict(config.params),
                "argv": list(launch.argv), "env": launch.run_env}  # fmt: skip

    first = [row for _ in points if (row := launch_row(ENQUEUED_KIND)) is not None]
    rows: list[dict[str, Any]] = []
    for _ in range(n * DRAWS_PER_ROW):
        if len(rows) == n:
            break
        if (row := launch_row(SAMPLED_KIND)) is not None:
            rows.append(row)
    if len(rows) < n:
        say(
            f"{len(rows)} of {n} configs planned: the engines' validation (or the study's trials) left out the rest "
            "of what was sampled"
        )
    if study is None:
        return first + rows
    said = predict_rows(first + rows, study, {name: adapter for name, (adapter, _, _) in targets.items()})
    return said[: len(first)] + by_prediction(said[len(first) :], study)


def planned_gpu(memory_gib: float, name: str | None = None) -> Device:
    """A GPU of another machine, to plan for: its memory in GiB and its name as the driver reports
    it, which an engine's defaults may read too (``EngineAdapter.scheduler_limits``)."""
    return Device("cuda", name or f"NVIDIA GPU (planned, {memory_gib:g} GiB)", int(memory_gib * 2**30))


def _gpu() -> Device:
    """The GPU visible here, whose memory sets the engines' defaults; else one of unknown memory."""
    if not gpu_visible():
        return PLANNED_GPU
    try:
        return gpu_device()
    except EnvironmentSetupError:
        return PLANNED_GPU


def _target(
    name: str, space: Space, engine_envs: dict[str, str], version: str | None
) -> tuple[EngineAdapter, EngineEnv | None, str]:
    """The engine's adapter, its environment when installed here (a flag's, else the space's), and
    the version planned for: ``version`` when given (planned as on a GPU, without the environment,
    unless that is the environment's), else the environment's, else the newest supported."""
    adapter = ADAPTERS[name]()
    if version is not None:
        try:
            adapter.check_version(version)
        except EnvironmentSetupError as exc:
            raise ConfigError(f"--engine-version {name}={version}: {exc}") from exc
    if name in engine_envs:  # a path the user named must hold the engine; only the default may be absent
        env: EngineEnv | None = probe_named(adapter, engine_envs[name], "--engine-env")
    elif name in space.engine_envs:
        env = probe_named(adapter, space.engine_envs[name], "the space's engine_envs:")
    else:
        env = _env_or_none(adapter, None)
    if env is not None and version is not None and env.version != version:
        env = None  # another version than the one installed: planned as for a GPU
    return adapter, env, version or (env.version if env else adapter.supported_versions[-1])
