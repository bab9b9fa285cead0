"""Capacity studies in the report: each tier's curves (finalists beside their engine defaults) and a table.

A capacity trial carries ``capacity`` (per tier: the SLO, the target attainment, ``capacity_req_s``, the
stop reason and the measured ``steps``) and the flat ``capacity_req_s`` / ``capacity_<tier>_req_s``.
Every read here is tolerant: an older study, or a failed trial with no ``capacity``, gives "-" or no
curve, never an error.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from tuner.report.describe import engine_of, params_list, params_text, trial_name
from tuner.report.plots import Curve, RateStep, capacity_figure
from tuner.study.attrs import capacity_uncertainty, is_default, study_attrs_of, tier_bracket_top, trial_attrs
from tuner.study.cost import cost_text
from tuner.study.figures import number
from tuner.study.objectives import is_capacity

Trial = optuna.trial.FrozenTrial
FLAT = re.compile(r"capacity_(.+)_req_s")
SLO_NAMES = {"ttft_p95_ms": "TTFT p95", "tpot_p95_ms": "TPOT p95", "e2e_p95_ms": "E2E p95"}


@dataclass(frozen=True)
class Tier:
    name: str
    slo: dict[str, float]
    target: float | None


def is_capacity_study(study: optuna.Study) -> bool:
    return is_capacity(study_attrs_of(study).get("objective"))


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _float(value: object) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None  # type: ignore[arg-type]


def _tier_attrs(trial: Trial, tier: str) -> dict[str, Any]:
    return _dict(_dict(_dict(trial_attrs(trial).get("capacity")).get("tiers")).get(tier))


def tier_capacity(trial: Trial, tier: str) -> float | None:
    found = _float(_tier_attrs(trial, tier).get("capacity_req_s"))
    return found if found is not None else _float(trial_attrs(trial).get(f"capacity_{tier}_req_s"))


def objective_capacity(trial: Trial) -> float | None:
    found = _float(trial_attrs(trial).get("capacity_req_s"))
    tier = _dict(trial_attrs(trial).get("capacity")).get("objective_tier")
    return found if found is not None or not isinstance(tier, str) else tier_capacity(trial, tier)


def tiers(study: optuna.Study) -> list[Tier]:
    """The tiers the trials measured, the objective's first, each with the first SLO and target recorded."""
    found: dict[str, Tier] = {}
    objective: object = None
    for t in study.get_trials(deepcopy=False):
        cap = _dict(trial_attrs(t).get("capacity"))
        objective = objective or cap.get("objective_tier")
        for name, attrs in _dict(cap.get("tiers")).items():
            slo = {k: b for k, v in _dict(_dict(attrs).get("slo")).items() if (b := _float(v)) is not None}
            found.setdefault(str(name), Tier(str(name), slo, _float(_dict(attrs).get("target"))))
        for key in t.user_attrs:
            if (m := FLAT.fullmatch(key)) and m.group(1) not in found:
                found[m.group(1)] = Tier(m.group(1), {}, None)
    return [found[n] for n in sorted(found, key=lambda n: n != objective)]


def slo_text(tier: Tier) -> str:
    bounds = ", ".join(f"{SLO_NAMES.get(k, k)} <= {v:g} ms" for k, v in tier.slo.items()) or "bounds not recorded"
    share = f" for at least {tier.target:.0%} of requests" if tier.target is not None else ""
    return f"{bounds}{share}"


def contains(loose: Tier, strict: Tier) -> bool:
    """Whether every request within ``strict``'s bounds is within ``loose``'s, at no higher a target
    share: then one server carries at least as much under ``loose`` as under ``strict`` (the presets'
    relaxed tier and their interactive one). Tiers whose bounds were not recorded contain nothing."""
    return (
        loose.name != strict.name and bool(loose.slo) and loose.slo.keys() <= strict.slo.keys()
        and all(bound >= strict.slo[k] for k, bound in loose.slo.items())
        and loose.target is not None and strict.target is not None and loose.target <= strict.target
    )  # fmt: skip


def tier_disagreements(study: optuna.Study) -> list[str]:
    """Each trial whose capacity under a tier is below its capacity under a tier that tier contains
    (``contains``), which one server cannot do: each tier's search serves its own rates once, and near
    the knee a serving of a rate need not repeat the next one (reports/gpu-h100.md, trial 14). A pruned
    tier's 0 claims only its bracket, so it is left out."""
    found = tiers(study)
    pairs = [(loose, strict) for loose in found for strict in found if contains(loose, strict)]
    said = []
    for t in study.get_trials(deepcopy=False):
        for loose, strict in pairs:
            low, high = tier_capacity(t, loose.name), tier_capacity(t, strict.name)
            if low is None or high is None or _tier_attrs(t, loose.name).get("pruned") or low >= high * (1 - 1e-9):
                continue
            said.append(f"trial {t.number}: {loose.name} {number(low)} req/s is below {strict.name} {number(high)} "
                        f"req/s, whose bounds it contains: each tier served its own rates once, and near the knee "
                        f"one serving need not repeat the next (a finalist's repeats measure both again)")  # fmt: skip
    return said


def bracket_top(trial: Trial, tier: str) -> float | None:
    """The lowest rate above the tier's capacity that did not pass (None: none, or an older study)."""
    return tier_bracket_top(_tier_attrs(trial, tier))


def capacity_cell(trial: Trial, tier: str) -> str:
    """The tier's capacity in req/s, ``pruned`` when the search stopped early, ``-`` when unknown; with
    the bracket it was resolved in (up to the lowest rate that did not pass) where the trial has one.
    A pruned tier records 0 req/s; its bracket says how far below the incumbent nothing passed."""
    found = tier_capacity(trial, tier)
    pruned = " pruned" if _tier_attrs(trial, tier).get("pruned") else ""
    high = bracket_top(trial, tier)
    upto = f"<{number(high)}" if high is not None and found is not None and high > found else ""
    return "-" if found is None else number(found) + upto + pruned


def curve_trials(study: optuna.Study) -> list[Trial]:
    """The finalists (or, with no repeats run, the trial of highest capacity), each engine's default after
    that engine's tuned configs."""
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    finalists = study_attrs_of(study).get("finalists")
    numbers = [f.get("trial") for f in finalists if isinstance(f, dict)] if isinstance(finalists, list) else []
    tuned = [trials[n] for n in numbers if n in trials and not is_default(trials[n])]
    if not tuned:
        rated = [(c, t) for t in trials.values() if not is_default(t) and (c := objective_capacity(t)) is not None]
        tuned = [max(rated, key=lambda ct: ct[0])[1]] if rated else []
    defaults = [t for t in trials.values() if is_default(t) and _dict(trial_attrs(t).get("capacity"))]
    engines = list(dict.fromkeys(engine_of(t) for t in tuned)) or list(dict.fromkeys(map(engine_of, defaults)))
    chosen: list[Trial] = []
    for engine in engines:
        chosen += [t for t in tuned if engine_of(t) == engine]
        chosen += [t for t in defaults if engine_of(t) == engine][-1:]  # the latest: an earlier one was re-run
    return chosen


def _step(row: Mapping[str, Any]) -> RateStep | None:
    rate = _float(row.get("rate_req_s"))
    if rate is None:
        return None
    verdict = "passed" if row.get("passed") else "undecided" if row.get("decision") == "undecided" else "failed"
    notes = [verdict, *(flag for flag in ("saturated", "collapsed", "queue_growing") if row.get(flag))]
    if row.get("held") is False:
        notes.append("decided at an early look")
    low, high = _float(row.get("attainment_low")), _float(row.get("attainment_high"))
    if low is not None and high is not None:
        notes.append(f"attainment interval [{low:.1%}, {high:.1%}]")
    return RateStep(rate, _float(row.get("attainment")), _float(row.get("ttft_p95_ms")),
                    _float(row.get("tpot_p95_ms")), bool(row.get("passed")), ", ".join(notes), low, high)  # fmt: skip


def curve(trial: Trial, tier: str) -> Curve | None:
    rows = _tier_attrs(trial, tier).get("steps")
    steps = [s for r in rows if isinstance(r, dict) and (s := _step(r))] if isinstance(rows, list) else []
    if not steps:
        return None
    about = "<br>".join(map(html.escape, params_list(trial))) if not is_default(trial) else "the engine's defaults"
    return Curve(trial_name(trial), about, sorted(steps, key=lambda s: s.rate_req_s),
                 tier_capacity(trial, tier), is_default(trial))  # fmt: skip


def capacity_section(study: optuna.Study) -> str:
    chosen, parts = curve_trials(study), []
    for i, tier in enumerate(tiers(study)):
        curves = [c for t in chosen if (c := curve(t, tier.name)) is not None]
        plot = (capacity_figure(curves, tier.target, tier.slo, f"capacity-plot-{i}") if curves
                else "<p>no finalist recorded steps for this tier</p>")  # fmt: skip
        parts.append(f"<h3>Tier {html.escape(tier.name)}</h3><p>SLO: {html.escape(slo_text(tier))}</p>{plot}")
    intro = ("<p>Each finalist beside its engine's default config: SLO attainment, TTFT p95 and TPOT p95 at each "
             "request rate measured (× marks a step that did not pass, the star the capacity found; the bars are "
             "each step's attainment interval).</p>")  # fmt: skip
    body = intro + "".join(parts) if parts else "<p>no trial recorded a capacity</p>"
    return f'<section id="capacity"><h2>Capacity under the SLO</h2>{body}</section>'


def _with_uncertainty(trial: Trial, tier: str) -> str:
    known = capacity_uncertainty(_tier_attrs(trial, tier))
    return capacity_cell(trial, tier) + (f" ({known})" if known else "")


def capacity_table_section(study: optuna.Study, price: float | None = None) -> str:
    names = [t.name for t in tiers(study)]
    head = "".join(f"<th>{html.escape(n)} (req/s)</th>" for n in names)
    head += f"<th>cost at the {html.escape(names[0])} capacity</th>" if names else ""
    rows = []
    for t in study.get_trials(deepcopy=False):
        status = trial_attrs(t).get("failure") or t.state.name.lower()
        cells = "".join(f"<td>{html.escape(_with_uncertainty(t, n))}</td>" for n in names)
        cells += f"<td>{html.escape(cost_text(t.user_attrs, names[0], price)) or '-'}</td>" if names else ""
        kind = "engine default" if is_default(t) else html.escape(params_text(t))
        rows.append(f"<tr><td>{t.number}</td><td>{html.escape(engine_of(t))}</td>"
                    f"<td>{html.escape(str(status))}</td>{cells}<td>{kind}</td></tr>")  # fmt: skip
    table = (f"<table><tr><th>trial</th><th>engine</th><th>status</th>{head}<th>params</th></tr>"
             f"{''.join(rows)}</table>") if rows else "<p>no trials</p>"  # fmt: skip
    disagree = "".join(f"<li>{html.escape(line)}</li>" for line in tier_disagreements(study))
    table += f"<h3>Tiers that disagree</h3><ul>{disagree}</ul>" if disagree else ""
    return f'<section id="capacity-table"><h2>Capacity per tier</h2>{table}</section>'


def predicted(trial: Trial, tier: str) -> dict[str, Any]:
    """What ``--sampler model`` predicted for the trial under ``tier`` before it booted (empty: nothing)."""
    return _dict(_dict(_dict(trial_attrs(trial).get("predicted")).get("tiers")).get(tier))


def has_predictions(study: optuna.Study) -> bool:
    return any(trial_attrs(t).get("predicted") for t in study.get_trials(deepcopy=False))


def predicted_cell(trial: Trial, tier: str) -> str:
    """The predicted capacity in req/s, with the range what was never measured allows (``low..high``);
    ``~c`` where the model kept a value only to rank configs and could not bound it (no claim: the
    target alone before any step without speculation served), ``?`` where the model could not predict
    (an engine never served), ``-`` where it was not asked."""
    said = predicted(trial, tier)
    if not said:
        return "-"
    central, low, high = (_float(said.get(k)) for k in ("capacity_req_s", "low_req_s", "high_req_s"))
    if central is None:
        return "?"
    if high is None:
        return f"~{number(central)}"
    if low is not None and high > low:
        return f"{number(low)}..{number(high)}"
    return number(central)
