"""Which trials count: the feasible ones, and their Pareto front (what is compared and exported).

Feasible: COMPLETE, the stored constraint within bounds (``tuner.study.attrs.constraint_violation``),
the stress check passed, and not a repeat of an earlier trial's outcome.
"""

from __future__ import annotations

import math

import optuna

from tuner.study.attrs import constraint_violation, study_attrs_of, trial_attrs

__all__ = ["feasible_pareto", "feasible_trials", "stress_failures"]


def stress_failures(study: optuna.Study) -> dict[int, str]:
    """Trials whose stress check failed (``tuner.measure.stress``), with the class it earned."""
    checks = study_attrs_of(study).get("stress") or {}
    return {int(n): c["failure"] for n, c in checks.items() if c.get("failure")}


def feasible_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """COMPLETE trials whose stored constraint says they served within bounds, less those that
    failed their stress check (a config that breaks at peak load is never on the front or exported)
    and those that only repeat an earlier trial's outcome (``duplicate_of``)."""
    failed = stress_failures(study)
    return [
        t
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
        if constraint_violation(t)[0] <= 0.0 and t.number not in failed and trial_attrs(t).get("duplicate_of") is None
    ]


def feasible_pareto(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    complete = [t for t in feasible_trials(study) if t.values is not None and all(map(math.isfinite, t.values))]
    # Compare in "larger is better" terms, whatever each objective's direction.
    signs = [-1.0 if d == optuna.study.StudyDirection.MINIMIZE else 1.0 for d in study.directions]
    scored = [(t, [s * v for s, v in zip(signs, t.values or [], strict=True)]) for t in complete]
    front = [t for t, a in scored if not any(_dominates(b, a) for o, b in scored if o is not t)]
    return sorted(front, key=lambda t: t.number)


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x >= y for x, y in zip(a, b, strict=True)) and any(x > y for x, y in zip(a, b, strict=True))
