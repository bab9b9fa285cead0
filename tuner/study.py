"""The Optuna study: storage, sampler with constraints, the default trial, and what each trial records.

Objectives: TTFT p95 in ms (minimise) and output throughput in tokens/s (maximise). A trial that
ran out of memory, crashed, or failed more than 0.5 % of its requests is COMPLETE with values
(inf, 0) and a positive constraint (Optuna 5's ``Trial.set_constraint``, which every built-in
sampler honours), so the sampler learns where engines break; such a trial is never on the
feasible Pareto front and never exported.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc

from tuner import objectives
from tuner.errors import ConfigError, StorageError
from tuner.intervals import trial_intervals
from tuner.naming import safe_name
from tuner.outcome import MAX_ERROR_RATE, TrialResult
from tuner.pruning import checkpoints
from tuner.storage import redacted, resilient

DIRECTIONS = objectives.directions("pareto")  # TTFT p95 (minimise), output throughput (maximise)
DEFAULT_KIND = "engine_default"


def storage_url(study_name: str, given: str | None) -> str:
    """``--storage``, else ``$TUNER_STORAGE``, else SQLite under ``studies/``, in a file named after
    the study that cannot leave that folder (``--study ../x`` is ``studies/_x.db``)."""
    url = given or os.environ.get("TUNER_STORAGE")
    if url:
        return url
    Path("studies").mkdir(exist_ok=True)
    return f"sqlite:///studies/{safe_name(study_name)}.db"


CONSTRAINT = "failure_or_error_rate"


def constraint_violation(ft: optuna.trial.FrozenTrial) -> list[float]:
    """The stored constraint: a value above 0 marks the trial infeasible (unknown: infeasible)."""
    return [float(ft.user_attrs.get("constraint_violation", 1.0))]


def open_study(
    name: str,
    storage: str | optuna.storages.BaseStorage,
    seed: int | None,
    objective: str = "pareto",
    sampler: str = "tpe",
) -> optuna.Study:
    """Create or resume the study, on a storage that retries through a database outage (``tuner.storage``)."""
    from tuner.samplers import make_sampler

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.create_study(
            study_name=name,
            storage=resilient(storage),
            directions=objectives.directions(objective),
            sampler=make_sampler(sampler, seed),
            load_if_exists=True,
        )
    except _OPEN_ERRORS as exc:
        where = redacted(storage) if isinstance(storage, str) else type(storage).__name__
        raise StorageError(f"cannot open study {name!r} at {where}: {_first_line(exc)}") from exc


_OPEN_ERRORS = (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ValueError, ImportError)


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def open_storage(url: str) -> optuna.storages.BaseStorage:
    try:
        return optuna.storages.get_storage(url)
    except _OPEN_ERRORS as exc:
        raise StorageError(f"cannot open {redacted(url)}: {_first_line(exc)}") from exc


def load_existing(name: str, storage: str) -> optuna.Study:
    try:
        return optuna.load_study(study_name=name, storage=resilient(storage))
    except KeyError as exc:
        raise StorageError(f"no study named {name!r} in {redacted(storage)}") from exc
    except _OPEN_ERRORS as exc:
        raise StorageError(f"cannot open {redacted(storage)}: {_first_line(exc)}") from exc


def bind_study_attrs(study: optuna.Study, attrs: dict[str, Any]) -> None:
    """Store what the study is about; refuse to mix trials of a different workload."""
    known = study.user_attrs.get("workload_digest")
    if known is not None and known != attrs["workload_digest"]:
        raise ConfigError(
            f"study {study.study_name!r} was driven by workload {study.user_attrs.get('workload')!r} "
            f"({known[:12]}); this run's workload is {attrs['workload_digest'][:12]}: use another --study"
        )
    if study.directions != objectives.directions(attrs.get("objective", "pareto")):
        raise ConfigError(
            f"study {study.study_name!r} optimises {study.user_attrs.get('objective', 'pareto')!r}, "
            f"not {attrs.get('objective')!r}: use another --study"
        )
    for key in ("hardware", "engines"):  # the hardware and the engine versions belong to the study
        known = study.user_attrs.get(key)
        if known is not None and attrs.get(key) is not None and known != attrs[key]:
            raise ConfigError(
                f"study {study.study_name!r} was made on {_describe_setup(study.user_attrs)}; this machine has "
                f"{_describe_setup(attrs)}: trials from different {key} must not mix, use another --study"
            )
    for key, value in attrs.items():
        if study.user_attrs.get(key) != value:
            study.set_user_attr(key, value)


def _describe_setup(attrs: Mapping[str, Any]) -> str:
    hw = attrs.get("hardware") or {}
    engines = ", ".join(f"{n} {e.get('version')}" for n, e in (attrs.get("engines") or {}).items())
    return f"{hw.get('name')} ({hw.get('memory_bytes', 0) / 2**30:.1f} GiB) with {engines}"


def enqueue_defaults(study: optuna.Study, engines: list[str]) -> None:
    """Each engine's default config runs first, so the winner is compared with no tuning at all; a
    default interrupted (FAIL) is queued again, so it is measured after all."""
    have = set()
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("config_kind") == DEFAULT_KIND and t.state != optuna.trial.TrialState.FAIL:
            # A waiting (enqueued, not yet run) trial keeps its params in system_attrs["fixed_params"].
            have.add(t.params.get("engine") or t.system_attrs.get("fixed_params", {}).get("engine"))
    for engine in engines:
        if engine not in have:
            study.enqueue_trial({"engine": engine}, user_attrs={"config_kind": DEFAULT_KIND})


def violation(result: TrialResult, objective: str = "pareto", slo: Mapping[str, float] | None = None) -> float:
    if result.failure is not None:
        return 1.0
    errors = max(0.0, result.metrics.get("error_rate", 1.0) - MAX_ERROR_RATE)
    return errors + objectives.slo_excess(objective, result.metrics, slo or {})


def record(
    trial: optuna.Trial, result: TrialResult, objective: str = "pareto", slo: Mapping[str, float] | None = None
) -> list[float]:
    """Store the trial's user attributes and return its objective values."""
    attrs: dict[str, Any] = {
        "ttft_p95_ms": _finite(result.ttft_p95_ms),
        "output_throughput_tok_s": result.output_throughput_tok_s,
        "failure": result.failure,
        "constraint_violation": violation(result, objective, slo),
        "argv": list(result.launch.argv),
        "engine": result.config.engine,
        "engine_version": result.engine_version,
        "config": dict(result.config.params),
        "metrics": {k: _finite(v) for k, v in result.metrics.items()},
        "server": result.server,
        "served_by": result.served_by,
        "peak_memory_bytes": result.peak_memory_bytes,
        "engine_gpu_peak_bytes": result.engine_gpu_peak_bytes,
        "boot_s": result.boot_s,
        "log_path": result.log_path,
        "log_tail": result.log_tail[-10000:],
        "warnings": result.warnings,
        "ttft_samples_ms": result.ttft_samples_ms,
        "request_log": result.request_log,
        "checkpoints": checkpoints(result.request_log, slo or {}) if result.failure is None else {},
        "ci": trial_intervals(result.request_log, result.metrics) if result.failure is None else {},
        "phases_s": result.phases_s,
        "pruned": result.pruned,
        "memory_estimate": result.memory_estimate,
        "memory_facts": result.memory_facts,
    }
    for key, value in attrs.items():
        trial.set_user_attr(key, json.loads(json.dumps(value)))
    trial.set_constraint(CONSTRAINT, attrs["constraint_violation"])
    return objectives.values(objective, result.metrics, failed=result.failure is not None)


def _finite(value: float) -> float | None:
    """JSON (and so the RDB storage) has no NaN or inf: store None instead."""
    return value if math.isfinite(value) else None
