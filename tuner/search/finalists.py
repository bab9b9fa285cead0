"""After the search: the finalists' fresh-boot repeats, their stress check, then the verdict.

Each finalist (``tuner.search.finalists.pick_finalists``: the best feasible tuned configs, then the engine
default) runs ``repeats`` more times on fresh boots; the last repeat also runs the stress check
(``tuner.measure.stress``) on the same server, so checking costs no extra boot (with no repeats, one boot
does the stress check alone). A finalist that fails its check is recorded in the study's ``stress``
attribute and as a trial of its own (``config_kind`` ``stress_check``, infeasible, carrying the
class), so the sampler of a resumed study learns that region breaks under load; it is then left out
of the front, the verdict and every export. When every tuned finalist fails, the next feasible
configs are checked, one boot each, until one passes or ``pick_finalists`` has no more.

The finalists are the top ``finalists`` feasible configs (Pareto-optimal first, ranked by the
deciding metric: goodput under the SLOs where there are SLOs, output throughput otherwise), plus the
engine default as the reference, each run ``repeats`` more times, every time on a fresh boot. For
every objective the tuner reports the mean, the 95 % interval (Student-t on the log scale, from 3
runs; ``tuner.study.verdict.interval``) and the coefficient of variation. The best config is
declared the winner only when its interval on the deciding metric lies wholly above the runner-up's;
otherwise the verdict is a tie that names both (with fewer than 3 runs, a tie for too few runs).
Results live in the study's ``finalists`` and ``verdict`` user attributes (shown by
optuna-dashboard, ``tuner trials`` and every export).
"""

from __future__ import annotations

import math
from typing import Any

import optuna

from tuner.engines import ADAPTERS
from tuner.engines.base import Config
from tuner.errors import ConfigError
from tuner.measure.stress import judge as judge_stress
from tuner.measure.trial import TrialContext, TrialResult, run_trial
from tuner.search import scoring as objectives
from tuner.study.attrs import (
    CONSTRAINT,
    DEFAULT_KIND,
    STRESS_CHECK_KIND,
    TrialAttrs,
    checked_trial_attrs,
    is_default,
    study_attrs_of,
    trial_attrs,
)
from tuner.study.feasible import feasible_pareto, feasible_trials, stress_failures
from tuner.study.objectives import objective_named
from tuner.study.verdict import repeat_stats, verdict_of

STRESS_ONLY = 0  # the repeat number (log file suffix) of a boot that only runs the stress check
# what a stress check keeps of its run; the default's are the reference for the others
_KEPT = ("ttft_p95_ms", "e2e_p95_ms", "tpot_p95_ms", "output_throughput_tok_s", "error_rate", "n_requests")


def run_finalists(
    study: optuna.Study, k: int, n: int, ctx: TrialContext, enforce_eager: bool, stress: bool = True
) -> dict[str, Any]:
    """Repeat and stress-check the finalists, store ``finalists``, ``stress`` and ``verdict`` on the
    study, and return the verdict."""
    # k is per deciding metric: a two-tier study repeats each tier's k best, which differ where the
    # tiers disagree (the first k of one ranking over all would leave the other tier's best out)
    chosen = pick_finalists(study, k)
    chosen.sort(key=lambda t: not is_default(t))  # the default first: the reference
    finalists = []
    for trial in chosen:
        runs = _runs(study, trial, n, ctx, enforce_eager, stress)
        if n > 0:
            finalists.append(_summary(trial, runs))
    if stress:
        taken = {t.number for t in chosen}
        spare = [t for t in pick_finalists(study, len(study.trials)) if t.number not in taken and not is_default(t)]
        while spare and not _a_tuned_config_passed(study, chosen):
            trial = spare.pop(0)
            chosen.append(trial)
            _runs(study, trial, 0, ctx, enforce_eager, True)
    if n > 0:
        study.set_user_attr("finalists", finalists)
    verdict = verdict_of(finalists, deciders(study), stress_failures(study))
    study.set_user_attr("verdict", verdict)
    return verdict


def _runs(
    study: optuna.Study, trial: optuna.trial.FrozenTrial, n: int, ctx: TrialContext, eager: bool, stress: bool
) -> list[dict[str, Any]]:
    """The finalist's ``n`` repeats, each stored on the study as it ends (``finalist_runs``), and its stress check,
    recorded as it ends: a search resumed after its machine went away (a GPU lease holds a few boots,
    the finalists a dozen) runs only what is missing. The check rides on the last repeat, or on a boot
    of its own where that repeat ran before without it."""
    config = config_of(trial, eager)
    # A capacity repeat starts at the trial's own capacity, so two steps bracket it, and is never pruned.
    metrics = trial_attrs(trial).get("metrics") or {}
    own = {
        tier: float(metrics.get(f"capacity_{tier}_req_s") or 0.0)
        for tier in (ctx.capacity.scored if ctx.capacity else ())
    }
    hint: dict[str, Any] = {"incumbents": own, "prune": False} if ctx.capacity else {}
    runs = list((study_attrs_of(study).get("finalist_runs") or {}).get(str(trial.number)) or [])[:n]
    for i in range(len(runs), n):
        check = stress and i == n - 1 and not _checked(study, trial)
        result = run_trial(trial.number, config, ctx, repeat=i + 1, stress=check, **hint)
        runs.append(_stored(study, trial, result, i + 1))
        if check:
            _record_check(study, trial, result, ctx)
    if stress and not _checked(study, trial):
        _record_check(study, trial, run_trial(trial.number, config, ctx, repeat=STRESS_ONLY, stress=True, **hint), ctx)
    return runs


def _stored(study: optuna.Study, trial: optuna.trial.FrozenTrial, result: TrialResult, repeat: int) -> dict[str, Any]:
    """A repeat as the study keeps it (what ``_summary`` reads), appended to the finalist's runs. A
    capacity repeat keeps its search per tier (steps, bracket, why it stopped) without the request
    rows, which the trial alone keeps: a repeat's figure is read with how it was reached."""
    run = {"repeat": repeat, "failure": result.failure, "ttft_samples_ms": list(result.ttft_samples_ms),
           "metrics": {m: result.metrics[m] for m in REPORTED if m in result.metrics}}  # fmt: skip
    if result.capacity is not None:
        run["capacity"] = {k: v for k, v in result.capacity.items() if k != "measured"}
    stored = dict(study_attrs_of(study).get("finalist_runs") or {})
    stored[str(trial.number)] = [*(stored.get(str(trial.number)) or []), run]
    study.set_user_attr("finalist_runs", stored)
    return run


def withdraw_repeat(study: optuna.Study, number: int, repeat: int, reason: str) -> dict[str, Any]:
    """Take trial ``number``'s last stored repeat out of its runs, so that a resumed search runs it
    again, and keep it with ``reason`` under ``finalist_runs_withdrawn``. For a repeat that a fault of
    the tuner measured, once the fault is fixed where the finalists run; the reason says which. Only
    before the verdict (which reads the runs), and only the last repeat, so the repeats stay numbered
    in order. A stress check that rode on it stays recorded."""
    attrs = study_attrs_of(study)
    if attrs.get("verdict") is not None:
        raise ConfigError("the finalists' verdict is stored: a repeat is withdrawn only before it")
    if not reason.strip():
        raise ConfigError("withdrawing a repeat needs its reason")
    stored = dict(attrs.get("finalist_runs") or {})
    runs = list(stored.get(str(number)) or [])
    if not runs or runs[-1].get("repeat") != repeat:
        last = runs[-1].get("repeat") if runs else None
        raise ConfigError(f"trial {number}: repeat {repeat} is not its last stored repeat ({last})")
    run = runs.pop()
    stored[str(number)] = runs
    withdrawn = dict(attrs.get("finalist_runs_withdrawn") or {})
    withdrawn[str(number)] = [*(withdrawn.get(str(number)) or []), {**run, "withdrawn": reason.strip()}]
    study.set_user_attr("finalist_runs_withdrawn", withdrawn)
    study.set_user_attr("finalist_runs", stored)
    return run


def _checked(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    return str(trial.number) in (study_attrs_of(study).get("stress") or {})


def _summary(trial: optuna.trial.FrozenTrial, runs: list[dict[str, Any]]) -> dict[str, Any]:
    served = [r for r in runs if r["failure"] is None]
    return {
        "trial": trial.number,
        "config_kind": trial_attrs(trial).get("config_kind"),
        "failures": [r["failure"] for r in runs if r["failure"] is not None],
        "stats": repeat_stats(runs, REPORTED),
        "ttft_samples_ms": sorted(x for r in served for x in r["ttft_samples_ms"]),
    }


def _judge_one(
    trial: optuna.trial.FrozenTrial, run: TrialResult, slo: dict[str, float], default_stress: dict[str, float] | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {"trial": trial.number, "config_kind": trial_attrs(trial).get("config_kind")}
    if run.stress is None:
        return {**entry, "ran": False, "failure": None, "why": f"the boot before it failed: {run.failure}"}
    s, m = run.stress, run.stress["metrics"]
    is_default = entry["config_kind"] == DEFAULT_KIND
    measured = {k: v for k, v in (trial_attrs(trial).get("metrics") or {}).items() if v is not None}
    engine = ADAPTERS.get(str(trial_attrs(trial).get("engine")))
    failure = judge_stress(
        m, measured, slo, s["alive"], s["log"], s["killed"], m if is_default else default_stress,
        engine() if engine is not None else None,
    )  # fmt: skip
    return {
        **entry, "ran": True, "failure": failure, **{k: _finite(m.get(k)) for k in _KEPT},
        "prompt_tokens": s["prompt_tokens"], "concurrency": s["concurrency"],
        "trial_ttft_p95_ms": (trial_attrs(trial).get("metrics") or {}).get("ttft_p95_ms"),
        "default_ttft_p95_ms": (default_stress or {}).get("ttft_p95_ms"),
        "log_tail": s["log"][-3000:] if failure else "",
    }  # fmt: skip


def _peak_figures(entry: dict[str, Any]) -> dict[str, float]:
    """A stored check's figures at peak, the reference the next configs are judged against."""
    return {k: float(entry[k]) for k in _KEPT if entry.get(k) is not None}


def _finite(value: Any) -> Any:
    return value if isinstance(value, int | float) and math.isfinite(value) else None


def _record_check(study: optuna.Study, trial: optuna.trial.FrozenTrial, run: TrialResult, ctx: TrialContext) -> None:
    """Judge one finalist's stress run and store it at once: the defaults' check, stored first, is the
    reference for the others."""
    checks = dict(study_attrs_of(study).get("stress") or {})
    default = next((c for c in checks.values() if c["config_kind"] == DEFAULT_KIND and c.get("ran")), None)
    # A capacity trial met its SLO at its capacity rate, not at the stress run's peak concurrency:
    # there only survival and a collapse against itself and the default are judged.
    entry = _judge_one(trial, run, {} if ctx.capacity else ctx.slo, _peak_figures(default) if default else None)
    checks[str(trial.number)] = entry
    if entry["failure"]:
        _add_failed_check(study, trial, entry)
    ctx.progress.line(_describe(entry))
    study.set_user_attr("stress", checks)


def _describe(entry: dict[str, Any]) -> str:
    head = f"stress check of trial {entry['trial']}"
    if not entry["ran"]:
        return f"{head}: not run ({entry['why']})"
    ttft, tokens, conc = entry.get("ttft_p95_ms"), entry["prompt_tokens"], entry["concurrency"]
    seen = f"TTFT p95 {ttft:.0f} ms" if ttft is not None else "no request served"
    verdict = f"failed: {entry['failure']}" if entry["failure"] else "passed"
    return f"{head} ({tokens} prompt tokens x concurrency {conc}, cold cache): {seen}; {verdict}"


def _add_failed_check(study: optuna.Study, trial: optuna.trial.FrozenTrial, entry: dict[str, Any]) -> None:
    """The failed check as a trial of its own, so the sampler and the dashboard see the class."""
    objective = objective_named(study_attrs_of(study).get("objective")).name
    of = trial_attrs(trial)
    attrs = TrialAttrs(
        config_kind=STRESS_CHECK_KIND, stress_of=trial.number, failure=entry["failure"], constraint_violation=1.0,
        engine=of.get("engine", ""), config=of.get("config", {}), launch=of.get("launch", {}), stress=entry,
    )  # fmt: skip
    study.add_trial(
        optuna.trial.create_trial(
            params=trial.params,
            distributions=trial.distributions,
            values=objectives.values(objective, {}, failed=True),
            user_attrs=checked_trial_attrs(attrs),
            constraints={CONSTRAINT: 1.0},
        )  # fmt: skip
    )


def _a_tuned_config_passed(study: optuna.Study, chosen: list[optuna.trial.FrozenTrial]) -> bool:
    checks = study_attrs_of(study).get("stress") or {}
    tuned = [t.number for t in chosen if not is_default(t)]
    return not tuned or any(checks.get(str(n), {}).get("ran") and not checks[str(n)]["failure"] for n in tuned)


# The repeats' statistics and the verdict.
REPORTED = (
    "ttft_p95_ms", "tpot_p95_ms", "output_throughput_tok_s", "goodput_req_s",
    "capacity_req_s", "capacity_interactive_req_s", "capacity_relaxed_req_s",
)  # fmt: skip


def deciders(study: optuna.Study) -> list[str]:
    """The metrics a verdict is on: capacity under each scored tier, else goodput (with SLOs) or throughput."""
    attrs = study_attrs_of(study)
    return list(objective_named(attrs.get("objective")).deciders(bool(attrs.get("slo"))))


def decider(study: optuna.Study) -> str:
    return deciders(study)[0]


def pick_finalists(study: optuna.Study, k: int) -> list[optuna.trial.FrozenTrial]:
    """The k best feasible tuned configs by each deciding metric (Pareto-optimal first), then the
    engine defaults; with two tiers, each tier's best are finalists, since their winners differ."""
    front = {t.number for t in feasible_pareto(study)}
    feasible = feasible_trials(study)
    tuned = [t for t in feasible if not is_default(t)]
    chosen: list[optuna.trial.FrozenTrial] = []
    for key in deciders(study):
        ranked = sorted(
            tuned, key=lambda t: (t.number not in front, -float(trial_attrs(t).get("metrics", {}).get(key) or 0.0))
        )
        chosen += [t for t in ranked[:k] if t not in chosen]
    return chosen + [t for t in feasible if is_default(t)]


def config_of(trial: optuna.trial.FrozenTrial, enforce_eager: bool) -> Config:
    attrs = trial.user_attrs
    is_default = attrs.get("config_kind") == DEFAULT_KIND
    return Config(attrs["engine"], dict(attrs.get("config", {})), enforce_eager, is_default)
