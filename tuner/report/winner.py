"""Whose launch command the report shows: the verdict's winner, both sides of a tie, or why there is none.

With no verdict (no finalist repeats ran, or they are still under way: on a GPU they span leases)
the best feasible trial stands in: the highest capacity in a capacity study, else the last trial of
the feasible Pareto front, and the sentence says so.
"""

from __future__ import annotations

from typing import Any

import optuna

from tuner.report.capacity import is_capacity_study, objective_capacity
from tuner.study.attrs import StudyAttrs, study_attrs_of
from tuner.study.feasible import feasible_pareto, feasible_trials
from tuner.study.verdict import verdicts_by_metric

Trial = optuna.trial.FrozenTrial


def launch_choice(study: optuna.Study) -> tuple[str, list[Trial]]:
    """A sentence naming the winner (or saying why there is none) and the trials whose commands to show."""
    attrs = study_attrs_of(study)
    verdict: Any = attrs.get("verdict")
    if not isinstance(verdict, dict) or not verdict.get("kind"):
        best = _best_feasible(study)
        if best is None:
            return "no winner: no feasible trial", []
        return f"{no_verdict_yet(attrs)}: trial {best.number} is the best feasible trial", [best]
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    by_metric = verdicts_by_metric(verdict)
    choices = {metric: _choice(v, trials) for metric, v in by_metric.items()}
    if len(set(choices.values())) == 1:  # one verdict, or every tier's alike: said once
        said, numbers = next(iter(choices.values()))
    else:  # a verdict per tier (capacity-pareto): each tier's, and every trial any of them names
        said = "; ".join(f"{metric}: {text}" for metric, (text, _) in choices.items())
        numbers = tuple(dict.fromkeys(n for _, named in choices.values() for n in named))
    return said, [trials[n] for n in numbers]


def _choice(verdict: dict[str, Any], trials: dict[int, Trial]) -> tuple[str, tuple[int, ...]]:
    """One metric's verdict as the launch section says it, and the trials whose commands it shows."""
    named = tuple(n for n in verdict.get("trials") or [] if isinstance(n, int) and n in trials)
    if verdict.get("kind") in ("winner", "sole") and named:
        return f"trial {named[0]} wins the verdict", named[:1]
    if verdict.get("kind") == "tie":
        return f"no winner: the verdict is a tie between trials {' and '.join(map(str, named))}", named
    return "no winner: no finalist served all its repeats", ()


def no_verdict_yet(attrs: StudyAttrs) -> str:
    """Why a study has no verdict: its finalists' repeats are under way (with how many are stored and
    withdrawn), or none ran."""
    stored = sum(len(runs) for runs in (attrs.get("finalist_runs") or {}).values())
    withdrawn = sum(len(runs) for runs in (attrs.get("finalist_runs_withdrawn") or {}).values())
    if not (stored or withdrawn):
        return "no finalist repeats ran"
    also = f", {withdrawn} withdrawn" if withdrawn else ""
    return f"no verdict yet: the finalists' repeats are under way ({stored} stored{also})"


def _best_feasible(study: optuna.Study) -> Trial | None:
    if is_capacity_study(study):
        rated = [(c, t) for t in feasible_trials(study) if (c := objective_capacity(t)) is not None]
        return max(rated, key=lambda ct: ct[0])[1] if rated else None
    front = feasible_pareto(study)
    return front[-1] if front else None
