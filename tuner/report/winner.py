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
    named = [n for n in verdict.get("trials") or [] if isinstance(n, int)]
    shown = [trials[n] for n in named if n in trials]
    if verdict["kind"] in ("winner", "sole") and shown:
        return f"trial {shown[0].number} wins the verdict", shown[:1]
    if verdict["kind"] == "tie":
        return f"no winner: the verdict is a tie between trials {' and '.join(map(str, named))}", shown
    return "no winner: no finalist served all its repeats", []


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
