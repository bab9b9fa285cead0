"""What a study and its trials record: the attribute names, the engine default trial, the study's setup.

Objectives: TTFT p95 in ms (minimise) and output throughput in tokens/s (maximise). A trial that
ran out of memory, crashed, or failed more than 0.5 % of its requests is COMPLETE with values
(inf, 0) and a positive constraint (Optuna 5's ``Trial.set_constraint``, which every built-in
sampler honours), so the sampler learns where engines break; such a trial is never on the
feasible Pareto front and never exported.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, TypedDict, cast

import optuna

from tuner.errors import ConfigError

DEFAULT_KIND = "engine_default"  # each engine's default config, enqueued first: the reference
SAMPLED_KIND = "sampled"  # a config the sampler (or the grid) proposed
ENQUEUED_KIND = "enqueued"  # a config the space's `enqueue:` lists, booted after the defaults (tuner.search.enqueue)
STRESS_CHECK_KIND = "stress_check"  # a finalist's failed stress check, recorded as an infeasible trial of its own
SCREENED = "screened"  # the failure class of a config the memory screen kept from booting (tuner.search.memory)


class TrialAttrs(TypedDict, total=False):
    """Every user attribute a trial carries, with its type: the one place their names are defined.

    Read them through ``trial_attrs(t)``, so mypy checks each key; write them through
    ``write_trial_attrs`` (or ``checked_trial_attrs`` for a trial made whole), which refuses a key
    not declared here. ``tests/unit/study/test_trial_record.py`` holds the other direction: every key
    declared here is written somewhere, but those of ``LEGACY_TRIAL_KEYS``.
    """

    config_kind: str  # DEFAULT_KIND, SAMPLED_KIND, ENQUEUED_KIND or STRESS_CHECK_KIND
    booted: bool
    worker: dict[str, Any]
    duplicate_of: int
    rejected_like: int
    idle_draft_like: int  # an earlier trial measured this config's draft accepting next to nothing: not booted
    refused: str  # why the engine refuses the config (EngineAdapter.refusal): not booted
    stress_of: int
    stress: dict[str, Any]
    failure: str | None
    constraint_violation: float
    ttft_p95_ms: float | None
    output_throughput_tok_s: float
    launch: dict[str, Any]  # LaunchSpec.stored(): python, module, args, host, port, env
    argv: list[str]  # trials of older tuners only
    engine: str
    engine_version: str
    config: dict[str, Any]
    metrics: dict[str, float | None]
    server: dict[str, float | None]
    served_by: dict[str, Any]
    peak_memory_bytes: int
    engine_gpu_peak_bytes: int | None
    boot_s: float | None
    log_path: str
    log_tail: str
    warnings: list[str]
    engine_overrides: list[str]  # what the engine said it changed of the config (EngineAdapter.overrides_in)
    ttft_samples_ms: list[float]
    request_log: list[dict[str, Any]]
    checkpoints: dict[str, dict[str, float]]
    ci: dict[str, Any]
    phases_s: dict[str, float]
    pruned: dict[str, Any] | None
    memory_estimate: dict[str, Any] | None
    memory_facts: dict[str, float]
    # method, label, draft, num_speculative_tokens, acceptance_rate, mean_accept_len, steps (None: off)
    speculation: dict[str, Any] | None
    capacity: dict[str, Any]  # CapacityOutcome.as_dict(): every tier's search and curve
    capacity_req_s: float
    capacity_interactive_req_s: float
    capacity_relaxed_req_s: float
    output_tok_s_per_gpu: float | None  # at the objective tier's capacity (tuner.study.cost)
    slo: dict[str, Any]  # the scored tier, its bounds and the attainment target
    predicted: dict[str, Any]  # --sampler model: each scored tier's capacity predicted before the boot


class StudyAttrs(TypedDict, total=False):
    """Every user attribute a study carries: what it is about, and what its finalists found."""

    workload: str
    workload_digest: str
    model: str
    drafts: dict[str, str]
    hardware: dict[str, Any]
    engines: dict[str, dict[str, Any]]
    space: dict[str, Any]
    objective: str
    slo: dict[str, float]
    capacity_plan: dict[str, Any] | None
    options: dict[str, Any]
    finalists: list[dict[str, Any]]
    # each finalist's fresh-boot repeats as they ended, by trial number (a resumed search runs the rest)
    finalist_runs: dict[str, list[dict[str, Any]]]
    # repeats taken out of finalist_runs, each with why (tuner.search.finalists.withdraw_repeat)
    finalist_runs_withdrawn: dict[str, list[dict[str, Any]]]
    verdict: dict[str, Any]
    stress: dict[str, dict[str, Any]]
    gpu_price_usd_per_hour: float  # tuner search --gpu-price (tuner.study.cost)
    verify: dict[str, dict[str, Any]]  # tuner search --verify: each tier's report (tuner.search.verify_server)


TRIAL_KEYS = frozenset(TrialAttrs.__annotations__)
LEGACY_TRIAL_KEYS = frozenset({"argv"})  # read from the studies of older tuners, never written now


def checked_trial_attrs(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """``attrs`` as they are stored: each key one ``TrialAttrs`` declares, each value JSON (which the
    RDB storage keeps); a key it does not declare is a programming error, raised as ``KeyError``."""
    unknown = set(attrs) - (TRIAL_KEYS - LEGACY_TRIAL_KEYS)
    if unknown:
        raise KeyError(f"trial attributes not declared in TrialAttrs: {', '.join(sorted(unknown))}")
    return {key: json.loads(json.dumps(value)) for key, value in attrs.items()}


def write_trial_attrs(trial: optuna.Trial, attrs: TrialAttrs) -> None:
    """Store ``attrs`` on a running trial, refusing any key ``TrialAttrs`` does not declare."""
    for key, value in checked_trial_attrs(attrs).items():
        trial.set_user_attr(key, value)


def trial_attrs(trial: optuna.trial.FrozenTrial | optuna.Trial) -> TrialAttrs:
    return cast(TrialAttrs, trial.user_attrs)


def study_attrs_of(study: optuna.Study) -> StudyAttrs:
    return cast(StudyAttrs, study.user_attrs)


def is_default(trial: optuna.trial.FrozenTrial | optuna.Trial) -> bool:
    return trial_attrs(trial).get("config_kind") == DEFAULT_KIND


CONSTRAINT = "failure_or_error_rate"


def constraint_violation(ft: optuna.trial.FrozenTrial) -> list[float]:
    """The stored constraint: a value above 0 marks the trial infeasible (unknown: infeasible)."""
    return [float(ft.user_attrs.get("constraint_violation", 1.0))]


def bind_study_attrs(study: optuna.Study, attrs: dict[str, Any]) -> None:
    """Store what the study is about; refuse to mix trials of a different workload."""
    known = study.user_attrs.get("workload_digest")
    if known is not None and known != attrs["workload_digest"]:
        raise ConfigError(
            f"study {study.study_name!r} was driven by workload {study.user_attrs.get('workload')!r} "
            f"({known[:12]}); this run's workload is {attrs['workload_digest'][:12]}: use another --study"
        )
    if study.user_attrs.get("objective", attrs.get("objective")) != attrs.get("objective"):
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
    have = {point.get("engine") for point in _queued(study, DEFAULT_KIND)}
    for engine in engines:
        if engine not in have:
            study.enqueue_trial(
                {"engine": engine}, user_attrs=checked_trial_attrs(TrialAttrs(config_kind=DEFAULT_KIND))
            )


def enqueue_configs(study: optuna.Study, points: list[dict[str, Any]]) -> None:
    """Each of ``points`` (Optuna params) queued once per study, in order, as ``ENQUEUED_KIND``: a
    point queued or run before (a resumed study, a second worker) is not queued again, and one
    interrupted (FAIL) is, as a default is."""
    have = _queued(study, ENQUEUED_KIND)
    kind = checked_trial_attrs(TrialAttrs(config_kind=ENQUEUED_KIND))
    for point in points:
        if point not in have:
            study.enqueue_trial(point, user_attrs=kind)
            have.append(point)


def _queued(study: optuna.Study, kind: str) -> list[dict[str, Any]]:
    """The params of the study's trials of ``kind`` that are queued, running or done; an interrupted
    (FAIL) one is left out, so it is queued again. A waiting (enqueued, not yet run) trial keeps its
    params in system_attrs["fixed_params"]."""
    return [
        t.system_attrs.get("fixed_params") or t.params
        for t in study.get_trials(deepcopy=False)
        if t.user_attrs.get("config_kind") == kind and t.state != optuna.trial.TrialState.FAIL
    ]


def predicted_claim(tier: Mapping[str, Any]) -> float | None:
    """The capacity a stored prediction (one tier of ``predicted``) claims: its central value where the
    model bounded it. None where it claims none: nothing predicted, or a value kept only to rank
    configs with no range (``high_req_s`` None; ``tuner.search.model.predict``)."""
    central, high = tier.get("capacity_req_s"), tier.get("high_req_s")
    if isinstance(central, int | float) and isinstance(high, int | float):
        return float(central)
    return None


def step_at_capacity(tier: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored step a tier's capacity record (``CapacityResult.as_dict``) was decided at, as the
    search named it (``at_step``: ``CapacityResult.at_capacity_index``); None: nothing passed, or a
    malformed record. A record stored before ``at_step`` existed is read as the search then decided:
    the passing step at the capacity's rate, the one served whole where a look had passed the rate
    early (``held``; older records lack it, and each of their steps stood as decided)."""
    steps = tier.get("steps")
    if not isinstance(steps, list):
        return None
    if "at_step" in tier:
        index = tier["at_step"]
        ok = isinstance(index, int) and 0 <= index < len(steps) and isinstance(steps[index], dict)
        return steps[index] if ok else None
    rate = tier.get("capacity_req_s")
    at = [r for r in steps if isinstance(r, dict) and r.get("passed") and r.get("rate_req_s") == rate]
    return next((r for r in at if r.get("held", True)), at[0] if at else None)


def tier_bracket_top(tier: Mapping[str, Any]) -> float | None:
    """The top of the bracket a tier's capacity record (``CapacityResult.as_dict``) was resolved in:
    the lowest rate above its capacity that did not pass. None where no rate above failed, and for a
    record of an older study, which kept no bracket. A trial's record and a repeat's read alike."""
    bracket = tier.get("bracket_req_s")
    top = bracket[1] if isinstance(bracket, list | tuple) and len(bracket) == 2 else None
    if not isinstance(top, int | float) or isinstance(top, bool) or not math.isfinite(top):
        return None
    return float(top)


def capacity_uncertainty(tier: Mapping[str, Any]) -> str:
    """A tier's capacity record (``CapacityResult.as_dict``) in words: the bracket it was resolved in
    and the attainment interval at it, e.g. ``in [30.2, 33.1) req/s, attainment 0.95 [0.92, 0.97]``;
    empty for a record of an older study, which kept neither."""
    parts = []
    bracket = tier.get("bracket_req_s")
    if isinstance(bracket, list | tuple) and len(bracket) == 2 and isinstance(bracket[0], int | float):
        high = bracket[1]
        parts.append(
            f"in [{bracket[0]:.3g}, {high:.3g}) req/s" if isinstance(high, int | float) else "no rate above failed"
        )
    interval = tier.get("attainment_interval")
    at = step_at_capacity(tier)
    if isinstance(interval, list | tuple) and len(interval) == 2 and all(isinstance(v, int | float) for v in interval):
        share = f"{at['attainment']:.2f} " if at is not None and isinstance(at.get("attainment"), int | float) else ""
        parts.append(f"attainment {share}[{interval[0]:.2f}, {interval[1]:.2f}]")
    return ", ".join(parts)
