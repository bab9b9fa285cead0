"""How the report writes a study and its trials in words: parameters, engines, figures, launch commands.

Floats are written with six significant digits, so a sampled ``0.30000000000000004`` reads ``0.3``. A
launch command is the trial's stored ``launch`` (``python -m MODULE ARGS``, no address; an older trial's
``argv`` less ``--host``/``--port``): the trial's random port means nothing to whoever deploys it, and
this is what ``tuner export --format sh`` runs before it adds ``--host "$HOST" --port "$PORT"``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tuner.study.attrs import is_default, trial_attrs
from tuner.study.figures import number
from tuner.study.verdict import TOO_FEW_RUNS

ADDRESS_FLAGS = ("--host", "--port")


def param_value(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def params_list(trial: optuna.trial.FrozenTrial) -> list[str]:
    return [f"{k}={param_value(v)}" for k, v in trial.params.items()]


def params_text(trial: optuna.trial.FrozenTrial) -> str:
    return " ".join(params_list(trial))


def mean_interval(stats: Mapping[str, Any]) -> str:
    """A finalist's ``mean [low, high]`` over its repeats as figures (``number``), or its mean and why
    there is no interval."""
    if stats.get("low") is None or stats.get("high") is None:  # fewer than 3 runs (tuner.measure.statistics)
        return f"{number(stats['mean'])} ({TOO_FEW_RUNS})"
    return f"{number(stats['mean'])} [{number(stats['low'])}, {number(stats['high'])}]"


def engine_of(trial: optuna.trial.FrozenTrial) -> str:
    return str(trial_attrs(trial).get("engine") or trial.params.get("engine") or "?")


def trial_name(trial: optuna.trial.FrozenTrial) -> str:
    """``trial 5 (vllm)``, or ``trial 0 (vllm default)`` for an engine's default config."""
    return f"trial {trial.number} ({engine_of(trial)}{' default' if is_default(trial) else ''})"


def engines_text(engines: object) -> str:
    """The study's ``engines`` attribute as ``vllm 0.32.0, sglang 0.5.23``."""
    if not isinstance(engines, Mapping):
        return str(engines) if engines else ""
    parts = []
    for name, about in engines.items():
        version = about.get("version") if isinstance(about, Mapping) else about
        parts.append(f"{name} {version}" if version else str(name))
    return ", ".join(parts)


def without_address(argv: Sequence[str]) -> list[str]:
    """The argv less ``--host``/``--port`` and their values (also written ``--port=N``)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ADDRESS_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{flag}=" for flag in ADDRESS_FLAGS)):
            kept.append(arg)
    return kept


def stored_command(trial: optuna.trial.FrozenTrial) -> list[str] | None:
    """``python -m MODULE ARGS`` without the address: from the stored ``launch``, or an older trial's ``argv``."""
    launch: Any = trial_attrs(trial).get("launch")
    if isinstance(launch, dict) and launch.get("module") and isinstance(launch.get("args"), list):
        return [str(launch.get("python") or "python"), "-m", str(launch["module"]), *map(str, launch["args"])]
    argv: Any = trial_attrs(trial).get("argv")
    return without_address([str(a) for a in argv]) if isinstance(argv, list) and argv else None


def launch_command(trial: optuna.trial.FrozenTrial) -> str:
    """The trial's engine command as exported, or a sentence saying why there is none."""
    command = stored_command(trial)
    return shlex.join(command) if command else f"trial {trial.number} recorded no launch command"


def engine_line(trial: optuna.trial.FrozenTrial) -> str:
    """``trial 5: vllm 0.32.0, module vllm.entrypoints.openai.api_server`` as far as the trial recorded it."""
    command = stored_command(trial) or []
    engine = " ".join(str(p) for p in (engine_of(trial), trial_attrs(trial).get("engine_version")) if p)
    module = f", module {command[2]}" if len(command) > 2 and command[1] == "-m" else ""
    return f"trial {trial.number}{' (engine default)' if is_default(trial) else ''}: {engine}{module}"
