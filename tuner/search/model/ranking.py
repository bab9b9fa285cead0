"""``tuner plan --study NAME``: the planned configs with the capacity a stored study's model predicts.

Every row is given the capacities the model predicts for it (the enqueued configs included: they are
the next boots), and the sampled ones are ranked by them. The model is fitted on the study's served
trials (``tuner.search.model.predict``) under the study's own capacity plan, and simulates the
requests its longest step sent (in order; their prompts are not stored, so each step's measured
prefix hits are spread over its requests). A study with nothing served, or not a capacity study,
predicts nothing: the rows come back as planned."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from tuner.engines.base import Device, EngineAdapter
from tuner.measure.rate_steps import CapacityPlan
from tuner.search.model.history import Served
from tuner.search.model.parallel import default_workers
from tuner.search.model.predict import EngineModel
from tuner.search.model.requests import Shape
from tuner.search.model.sampler import served_trials
from tuner.study.attrs import study_attrs_of


def plan_of_study(study: optuna.Study) -> CapacityPlan | None:
    stored = study_attrs_of(study).get("capacity_plan")
    if not stored:
        return None
    fields = {k: v for k, v in stored.items() if k in CapacityPlan.__dataclass_fields__}
    return CapacityPlan(**{**fields, "tiers": {k: dict(v) for k, v in stored["tiers"].items()},
                           "scored": tuple(stored["scored"])})  # fmt: skip


def device_of_study(study: optuna.Study) -> Device:
    """The machine the study's trials measured (its stored hardware), which the model is fitted for."""
    hw = study_attrs_of(study).get("hardware") or {}
    return Device(str(hw.get("kind", "cuda")), str(hw.get("name", "")), int(hw.get("memory_bytes") or 0))


def shapes_of(served: Sequence[Served]) -> list[Shape]:
    """The requests the model simulates: those the longest step of ``served`` answered, in send order
    (their prompts are not stored, so each step's measured prefix hits are spread over its requests)."""
    longest = max((step for s in served for step in s.steps), key=lambda step: len(step.rows))
    ordered = sorted(longest.rows, key=lambda r: float(r["sent_s"]))
    return [Shape(int(r["prompt_tokens"] or 1), max(int(r["output_tokens"] or 0), 1)) for r in ordered
            if r.get("done_s") is not None]  # fmt: skip


def predict_rows(
    rows: Sequence[dict[str, Any]], study: optuna.Study, adapters: Mapping[str, EngineAdapter]
) -> list[dict[str, Any]]:
    """``rows`` (``tuner plan``'s: engine, params, argv...) in their order, each with ``predicted``
    (req/s per scored tier; None where the model cannot say), ``predicted_range`` (per tier the
    ``[low, high]`` the unmeasured parts allow, one value twice where all is known; None where the
    prediction only ranks) and ``predicted_basis``; unchanged where the study has no capacity plan or
    nothing served."""
    plan = plan_of_study(study)
    served = served_trials(study, {})
    if plan is None or not served:
        return list(rows)
    # the fit and the predictions over this machine's cores, as the sampler's are: the same figures, sooner
    workers = default_workers()
    model = EngineModel.fit(served, adapters, device_of_study(study), plan, shapes_of(served), workers=workers)
    predictions = model.predict_many([(row["engine"], row["params"], None) for row in rows], workers=workers)
    out = []
    for row, said in zip(rows, predictions, strict=True):
        out.append({**row, "predicted": {tier: p.capacity_req_s for tier, p in said.items()},
                    "predicted_range": {tier: None if p.low_req_s is None else [p.low_req_s, p.high_req_s]
                                        for tier, p in said.items()},
                    "predicted_basis": next(iter(said.values())).basis})  # fmt: skip
    return out


def by_prediction(rows: Sequence[dict[str, Any]], study: optuna.Study) -> list[dict[str, Any]]:
    """``predict_rows``' rows, highest predicted capacity first under the study's objective tier (rows
    the model cannot say last, in their order)."""
    plan = plan_of_study(study)
    if plan is None:
        return list(rows)
    first = plan.scored[0]

    def key(row: dict[str, Any]) -> float:
        value = (row.get("predicted") or {}).get(first)
        return -value if value is not None else 1.0

    return sorted(rows, key=key)
