"""Which engine suits the workload, by measurement: each engine's best capacity per tier, and its cost.

For each tier a capacity study measured, and each engine it booted: the feasible trial with the
highest capacity there (stress-check failures and repeats of another trial's config left out, as
everywhere; among equal capacities the Pareto-optimal one, which the finalists' pick ranks first, so
that its repeats are the ones read), its capacity with the bracket it was resolved in, the output
tokens/s per GPU at it and, given a price, the dollars per million output tokens; beside it, the
capacity of that engine's defaults. The sentence under each tier is computed from those numbers:
which engine carried more, and by how much; that one drive each cannot tell them apart, where the
higher claim lies inside the other's bracket (a tie included); or that only one engine was measured.
Where both engines' best trials were finalists with at least three fresh-boot repeats, the sentence
compares the repeats' means instead, and says so where their 95 % intervals overlap. A second
sentence per engine holds its best against its own defaults, the question a user asks first (did
tuning carry more?), read the same way: from the repeats where both have them, else from one drive
each. Trials not yet run (an enqueued config waiting for its boot) name no engine here. An engine
booted only by trials that failed before they recorded a capacity (an interrupted lease, a boot that
died) was not measured: it is named as such, never as an engine that carried no load.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import optuna

from tuner.report.capacity import bracket_top, capacity_cell, tier_capacity, tiers
from tuner.report.describe import engine_of, mean_interval
from tuner.study.attrs import is_default, study_attrs_of, trial_attrs
from tuner.study.cost import cost_text
from tuner.study.feasible import feasible_pareto, feasible_trials
from tuner.study.figures import number
from tuner.study.verdict import intervals_overlap

Trial = optuna.trial.FrozenTrial


@dataclass(frozen=True)
class EngineBest:
    engine: str
    best: Trial | None  # the feasible trial of highest capacity in the tier (None: none served it)
    default: Trial | None  # the engine's defaults (re-run: the latest that recorded a capacity, else the latest)
    repeats: dict[str, float] | None = None  # the best's capacity in the tier over its finalist repeats
    measured: bool = True  # a trial of it recorded a capacity in the tier (0 included)
    failed: int = 0  # its trials that ended FAIL or recorded a failure class (out of memory, screened, ...)
    default_repeats: dict[str, float] | None = None  # the defaults' capacity in the tier over their repeats

    def capacity(self, tier: str) -> float:
        found = tier_capacity(self.best, tier) if self.best is not None else None
        return found or 0.0


def per_engine(study: optuna.Study, tier: str) -> list[EngineBest]:
    """Each engine the study booted, with its best feasible trial in ``tier`` and its defaults."""
    everything = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()]
    engines = sorted({engine_of(t) for t in everything})
    feasible = feasible_trials(study)
    front = {t.number for t in feasible_pareto(study)}
    found = []
    for engine in engines:
        served = [t for t in feasible if engine_of(t) == engine and (tier_capacity(t, tier) or 0.0) > 0]
        best = max(served, key=lambda t: (tier_capacity(t, tier) or 0.0, t.number in front, -t.number), default=None)
        own = [t for t in everything if engine_of(t) == engine]
        defaults = [t for t in own if is_default(t)]
        # the latest that recorded a capacity (an earlier one was re-run); a failed re-run hides none
        defaults = [t for t in defaults if tier_capacity(t, tier) is not None] or defaults
        repeats = repeat_stats(study, best.number, tier) if best is not None else None
        default = defaults[-1] if defaults else None
        default_repeats = repeat_stats(study, default.number, tier) if default is not None else None
        measured = any(tier_capacity(t, tier) is not None for t in own)
        failed = sum(t.state == optuna.trial.TrialState.FAIL or bool(trial_attrs(t).get("failure")) for t in own)
        found.append(EngineBest(engine, best, default, repeats, measured, failed, default_repeats))
    return found


def repeat_stats(study: optuna.Study, number: int, tier: str) -> dict[str, float] | None:
    """Trial ``number``'s capacity in ``tier`` over its fresh-boot repeats (mean, 95 % ``low`` and
    ``high``, ``n``; ``tuner.search.finalists``), or None: not a finalist, or fewer than three runs."""
    finalists = study_attrs_of(study).get("finalists") or []
    entry = next((f for f in finalists if isinstance(f, dict) and f.get("trial") == number), None)
    stats = ((entry or {}).get("stats") or {}).get(f"capacity_{tier}_req_s")
    if not isinstance(stats, dict) or not all(isinstance(stats.get(k), int | float) for k in ("mean", "low", "high")):
        return None
    return {k: float(v) for k, v in stats.items() if isinstance(v, int | float)}


def _repeated(first: EngineBest, second: EngineBest) -> str:
    """The sentence from two engines' repeats (both present), the higher mean first."""
    a, b = sorted((first, second), key=lambda r: -(r.repeats or {}).get("mean", 0.0))
    ra, rb = a.repeats or {}, b.repeats or {}
    carried = (f"{a.engine} carried {mean_interval(ra)} req/s and {b.engine} {mean_interval(rb)} "
               "over fresh-boot repeats")  # fmt: skip
    if intervals_overlap(ra, rb):
        return f"{carried}: their 95 % intervals overlap, so the repeats cannot tell them apart."
    return f"{carried}: {a.engine} {ra['mean'] / rb['mean']:.2f}x on this workload."


def _not_measured(rows: list[EngineBest]) -> str:
    """The sentence for engines no trial of which recorded a capacity in the tier."""
    named = " and ".join(f"{r.engine} ({r.failed} failed)" if r.failed else r.engine for r in rows)
    return f"No trial of {named} recorded a capacity here, so it is not compared."


def comparison(rows: list[EngineBest], tier: str) -> str:
    """One sentence from the numbers: who carried more in ``tier``, and by how much."""
    if len(rows) < 2:
        return "Only one engine was booted in this study: nothing to compare."
    measured = [r for r in rows if r.measured]
    unmeasured = [r for r in rows if not r.measured]
    if not measured:
        return "No trial of any engine recorded a capacity under this tier: nothing to compare."
    if unmeasured:
        return f"{_measured(measured, tier)} {_not_measured(unmeasured)}"
    return _measured(measured, tier)


def _measured(rows: list[EngineBest], tier: str) -> str:
    """The comparison among engines a trial of which recorded a capacity in ``tier``."""
    served = sorted((r for r in rows if r.capacity(tier) > 0), key=lambda r: -r.capacity(tier))
    if len(rows) == 1:
        only = rows[0]
        load = f"{number(only.capacity(tier))} req/s" if served else "no load under this tier's SLO"
        return f"{only.engine} carried {load}."
    if not served:
        return "No engine carried any load under this tier's SLO."
    if len(served) == 1:
        return f"Only {served[0].engine} carried load under this tier's SLO."
    first, second = served[0], served[1]
    if first.repeats is not None and second.repeats is not None:
        return _repeated(first, second)
    top = bracket_top(second.best, tier) if second.best is not None else None
    if top is not None and first.capacity(tier) < top:
        return (f"{first.engine} carried {number(first.capacity(tier))} req/s and {second.engine} "
                f"{number(second.capacity(tier))} (its bracket runs to {number(top)}): one drive each cannot "
                "tell them apart; repeats decide.")  # fmt: skip
    ratio = first.capacity(tier) / second.capacity(tier)
    return (f"{first.engine} carried {number(first.capacity(tier))} req/s, {second.engine} "
            f"{number(second.capacity(tier))}: {first.engine} {ratio:.2f}x on this workload.")  # fmt: skip


def beside_defaults(r: EngineBest, tier: str) -> str | None:
    """One sentence: the engine's best in ``tier`` against its own defaults, from the repeats where
    both have them, else from one drive each; None where either was not measured."""
    best, default = r.best, r.default
    if best is None or default is None or tier_capacity(default, tier) is None:
        return None
    if is_default(best) or best.number == default.number:
        return f"{r.engine}: no tuned config carried more than its defaults (trial {default.number})."
    head = f"{r.engine}: trial {best.number} against its defaults (trial {default.number})"
    if r.repeats is not None and r.default_repeats is not None:
        tuned, own = r.repeats, r.default_repeats
        figures = f"{head} carried {mean_interval(tuned)} and {mean_interval(own)} req/s over fresh-boot repeats"
        if own["mean"] <= 0:
            return f"{figures}: its defaults carried nothing under this tier."
        ratio = tuned["mean"] / own["mean"]
        if intervals_overlap(tuned, own):
            return f"{figures}, {ratio:.2f}x: their 95 % intervals overlap, so the repeats cannot tell them apart."
        if ratio < 1:  # the sampled best's single drive read high: its repeats fell below the defaults'
            return f"{figures}: {ratio:.2f}x, their 95 % intervals apart: its defaults carried more."
        return f"{figures}: {ratio:.2f}x, their 95 % intervals apart."
    tuned_c, own_c = r.capacity(tier), tier_capacity(default, tier) or 0.0
    figures = f"{head} carried {number(tuned_c)} and {number(own_c)} req/s"
    if own_c <= 0:
        return f"{figures}: its defaults carried nothing under this tier."
    top = bracket_top(default, tier)
    if top is not None and tuned_c < top:
        return f"{figures} (its defaults' bracket runs to {number(top)}): one drive each cannot tell them apart."
    return f"{figures}: {tuned_c / own_c:.2f}x in one drive each; the finalists' repeats decide."


@dataclass(frozen=True)
class _Row:
    """One engine's line of a tier, as both the HTML section and summary.md show it."""

    tuned: str  # which trial carried the most
    capacity: str
    cost: str
    defaults: str


def _row(r: EngineBest, tier: str, price: float | None) -> _Row:
    best = r.best
    tuned = f"trial {best.number}" + (" (its defaults)" if is_default(best) else "") if best else "-"
    again = f"; repeats {mean_interval(r.repeats)}" if r.repeats else ""
    return _Row(
        tuned,
        (capacity_cell(best, tier) + again) if best else ("0" if r.measured else "not measured"),
        (_cost(best, tier, price, r.repeats) if best is not None else "") or "-",
        _defaults_cell(r.default, tier, r.default_repeats),
    )


def _cost(best: Trial, tier: str, price: float | None, repeats: dict[str, float] | None) -> str:
    """The best's cost at its own capacity and, with repeats, at their mean."""
    own = cost_text(best.user_attrs, tier, price)
    again = cost_text(best.user_attrs, tier, price, repeats["mean"]) if repeats else ""
    return f"{own}; at the repeats' mean: {again}" if own and again else own


def _defaults_cell(default: Trial | None, tier: str, repeats: dict[str, float] | None = None) -> str:
    if default is None:
        return "not booted"
    if default.state == optuna.trial.TrialState.FAIL:
        return "failed"
    return capacity_cell(default, tier) + (f"; repeats {mean_interval(repeats)}" if repeats else "")


def engines_section(study: optuna.Study, price: float | None = None) -> str:
    parts = []
    for tier in tiers(study):
        rows = per_engine(study, tier.name)
        cells = []
        for r in rows:
            row = _row(r, tier.name, price)
            cells.append(
                f"<tr><td>{html.escape(r.engine)}</td><td>{html.escape(row.tuned)}</td>"
                f"<td>{html.escape(row.capacity)}</td><td>{html.escape(row.cost)}</td>"
                f"<td>{html.escape(row.defaults)}</td></tr>"
            )
        table = ("<table><tr><th>engine</th><th>best feasible config</th><th>capacity (req/s)</th>"
                 f"<th>cost at it</th><th>its defaults (req/s)</th></tr>{''.join(cells)}</table>")  # fmt: skip
        said = [comparison(rows, tier.name), *(s for r in rows if (s := beside_defaults(r, tier.name)))]
        paragraphs = "".join(f"<p>{html.escape(s)}</p>" for s in said)
        parts.append(f"<h3>Tier {html.escape(tier.name)}</h3>{table}{paragraphs}")
    body = "".join(parts) or "<p>no trial recorded a capacity</p>"
    return f'<section id="engines"><h2>Which engine suits this workload</h2>{body}</section>'


def engines_md(study: optuna.Study, price: float | None = None) -> list[str]:
    """The same comparison as Markdown lines, for ``summary.md``: the cost at each best (output
    tokens/s per GPU and, given ``price``, dollars per million output tokens) as the HTML shows it."""
    lines = []
    for tier in tiers(study):
        rows = per_engine(study, tier.name)
        head = "| engine | best trial | capacity (req/s) | cost at it | defaults (req/s) |"
        lines += ["", f"## Engines, tier {tier.name}", "", head, "|---|---|---|---|---|"]
        for r in rows:
            row = _row(r, tier.name, price)
            best = f"{r.best.number}" if r.best is not None else "-"
            lines.append(f"| {r.engine} | {best} | {row.capacity} | {row.cost} | {row.defaults} |")
        lines += ["", comparison(rows, tier.name)]
        lines += [s for r in rows if (s := beside_defaults(r, tier.name))]
    return lines
