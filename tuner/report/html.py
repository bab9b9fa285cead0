"""``tuner report --study NAME``: ``reports/<study>/index.html`` (Plotly plots) and ``summary.md``.

Sections: the Pareto front with infeasible trials marked by failure class and the TTFT CDFs of the
finalists, or, in a capacity study, each tier's capacity curves and the capacity table
(``tuner.report.capacity``); then parameter importance (Optuna's PED-ANOVA); the winner against the
engine default with the repeats' 95 % intervals; the failure map over the two most important
parameters; speculative acceptance by method, draft or head, and K; the launch command of the winner. plotly.js
is inlined once in the head, so the page is one file that needs no network.
"""

from __future__ import annotations

import html
import math
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import optuna

from tuner.naming import safe_name
from tuner.report.capacity import (
    capacity_section,
    capacity_table_section,
    has_predictions,
    is_capacity_study,
    objective_capacity,
    predicted,
    predicted_cell,
    tier_capacity,
    tiers,
)
from tuner.report.describe import (
    engine_line,
    engine_of,
    engines_text,
    launch_command,
    mean_interval,
    params_list,
    params_text,
)
from tuner.report.engines import engines_md, engines_section
from tuner.report.overrides import overrides_md, overrides_section
from tuner.report.plots import Point, Series, cdf, plotly_script, scatter
from tuner.report.trial_costs import costs_md, costs_section
from tuner.report.trials_table import repeats_cell, reread_lines, study_price
from tuner.report.verified import verified_md, verified_section
from tuner.report.winner import launch_choice, no_verdict_yet
from tuner.study.attrs import (
    DEFAULT_KIND,
    ENQUEUED_KIND,
    SAMPLED_KIND,
    is_default,
    predicted_claim,
    study_attrs_of,
    trial_attrs,
)
from tuner.study.cost import cost_text
from tuner.study.feasible import feasible_pareto
from tuner.study.figures import number
from tuner.study.objectives import objective_named
from tuner.study.verdict import describe_verdict, verdicts_by_metric

Trial = optuna.trial.FrozenTrial


def _completed(study: optuna.Study) -> list[Trial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def _name(t: Trial) -> str:
    return f"trial {t.number}" + (" (engine default)" if is_default(t) else "")


def _about(t: Trial) -> str:
    """Hover text: the trial and one parameter a line, escaped."""
    return "<br>".join(html.escape(line) for line in (_name(t), *params_list(t)))


def pareto_section(study: optuna.Study) -> str:
    front = {t.number for t in feasible_pareto(study)}
    points = [
        Point(trial_attrs(t).get("ttft_p95_ms") or 0.0, trial_attrs(t)["output_throughput_tok_s"], _about(t),
              "Pareto front" if t.number in front else "feasible")
        for t in _completed(study) if trial_attrs(t).get("failure") is None and trial_attrs(t).get("ttft_p95_ms")
    ]  # fmt: skip
    failed = [t for t in _completed(study) if trial_attrs(t).get("failure")]
    rows = "".join(f"<tr><td>{t.number}</td><td>{html.escape(str(trial_attrs(t)['failure']))}</td>"
                   f"<td>{html.escape(params_text(t))}</td></tr>" for t in failed)  # fmt: skip
    plot = (scatter(points, "Pareto front", "TTFT p95 (ms)", "output throughput (tok/s)", "pareto-plot")
            if points else "<p>no feasible trial</p>")  # fmt: skip
    table = f"<table><tr><th>trial</th><th>failure class</th><th>params</th></tr>{rows}</table>" if failed else ""
    return f'<section id="pareto"><h2>Pareto front</h2>{plot}<h3>Infeasible trials</h3>{table or "none"}</section>'


def cdf_section(study: optuna.Study) -> str:
    trials = {t.number: t for t in study.get_trials(deepcopy=False)}
    finalists = [
        f for f in study_attrs_of(study).get("finalists", []) if f.get("ttft_samples_ms") and f["trial"] in trials
    ]
    series = [Series(f"trial {f['trial']}", f["ttft_samples_ms"], _about(trials[f["trial"]])) for f in finalists]
    if not series:  # no repeats ran: fall back to the front's own runs
        front = [t for t in feasible_pareto(study) if trial_attrs(t).get("ttft_samples_ms")]
        series = [Series(_name(t), trial_attrs(t)["ttft_samples_ms"], _about(t)) for t in front]
    body = cdf(series, "TTFT CDF", "TTFT (ms)", "ttft-cdf-plot") if series else "<p>no TTFT samples recorded</p>"
    return f'<section id="ttft-cdf"><h2>TTFT of the finalists</h2>{body}</section>'


# PED-ANOVA ranks parameters by how the best TARGET_QUANTILE of the finished trials differ from the rest;
# Optuna's documentation advises at least ADVISED_TOP trials in that top for a stable ranking.
TARGET_QUANTILE = 0.1
ADVISED_TOP = 5


def importances(study: optuna.Study) -> dict[str, float]:
    # an enqueued config sets every parameter as a sampled one does, so it informs the importances too
    sampled = [t for t in _completed(study) if trial_attrs(t).get("config_kind") in (SAMPLED_KIND, ENQUEUED_KIND)]
    if len(sampled) < 2:
        return {}
    capacity = is_capacity_study(study)

    def target(t: Trial) -> float:
        value = objective_capacity(t) if capacity else trial_attrs(t).get("output_throughput_tok_s")
        return float(value or 0.0)

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few trials: the evaluator warns, the ranking is still the best we have
            evaluator = optuna.importance.PedAnovaImportanceEvaluator(target_quantile=TARGET_QUANTILE)
            return optuna.importance.get_param_importances(study, evaluator=evaluator, target=target)
    except (ValueError, RuntimeError):
        return {}


def importance_basis(finished: int) -> str:
    """What the ranking rests on: PED-ANOVA's top of ``finished`` trials, and whether it holds as
    many as Optuna advises (a GPU study of a dozen or so boots has one or two in its top tenth)."""
    top = math.ceil(TARGET_QUANTILE * finished)
    said = (f"PED-ANOVA over the {finished} finished trials: how the parameters of the best "
            f"{TARGET_QUANTILE:.0%} of them ({top}) differ from the rest's")  # fmt: skip
    if top < ADVISED_TOP:
        said += f"; Optuna advises at least {ADVISED_TOP} trials in that top, so read the ranking as a hint"
    return said + "."


def importance_section(found: dict[str, float], capacity: bool, finished: int) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.3f}</td></tr>" for k, v in found.items())
    table = f"<table><tr><th>parameter</th><th>importance</th></tr>{rows}</table>"
    body = f"<p>{html.escape(importance_basis(finished))}</p>{table}" if rows else "<p>too few trials</p>"
    on = "capacity" if capacity else "output throughput"
    return f'<section id="importance"><h2>Parameter importance ({on})</h2>{body}</section>'


CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:80em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
    "pre{white-space:pre-wrap;word-break:break-all;background:#f6f6f6;padding:8px}"
)


def best_vs_default_section(study: optuna.Study, price: float | None = None) -> str:
    """The finalists' repeats: once the stage ended each one's mean [95 % interval] per metric, with
    the cost at its mean capacity, and the verdict; while it runs, the repeats stored so far
    (``finalist_rows``, as summary.md shows them) and that the verdict is still to come."""
    finalists = [f for f in study_attrs_of(study).get("finalists", []) if isinstance(f, dict)]
    if not finalists:
        return _repeats_under_way(study)
    metrics = list(dict.fromkeys(m for f in finalists for m in f.get("stats") or {}))
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    # each tier's cost column, at the repeats' mean capacity under it (a capacity-pareto study scores two)
    priced = [t.name for t in tiers(study)] if is_capacity_study(study) else []
    head = "".join(f"<th>{html.escape(m)}</th>" for m in metrics) + "".join(
        f"<th>cost at the {html.escape(tier)} SLO (at the repeats' mean capacity)</th>" for tier in priced
    )
    rows = []
    for f in finalists:
        stats = f.get("stats") or {}
        cells = "".join(f"<td>{mean_interval(s)}</td>" if (s := stats.get(m)) else "<td>-</td>" for m in metrics)
        trial = by_number.get(f.get("trial"))  # type: ignore[arg-type]
        for tier in priced:  # the repeats' mean capacity priced: output tokens per GPU, and $ with a price
            mean = (stats.get(f"capacity_{tier}_req_s") or {}).get("mean")
            cells += f"<td>{html.escape(cost_text(trial.user_attrs, tier, price, mean) if trial else '') or '-'}</td>"
        kind = "engine default" if f.get("config_kind") == DEFAULT_KIND else "tuned"
        rows.append(f"<tr><td>trial {f.get('trial')} ({kind})</td>{cells}</tr>")
    verdict = study_attrs_of(study).get("verdict")
    text = html.escape(describe_verdict(verdict)) if verdict else "no verdict was stored"
    again = reread_lines(study)  # where the stored verdict was judged on older intervals: this version's
    items = "".join(f"<li>{html.escape(line)}</li>" for line in again[1:])
    after = f"<p>{html.escape(again[0])}</p><ul>{items}</ul>" if again else ""
    table = f"<table><tr><th>config</th>{head}</tr>{''.join(rows)}</table>"
    return _best_vs_default(table, text, after)


def _repeats_under_way(study: optuna.Study) -> str:
    metrics, rows = finalist_rows(study)
    cells = "".join(
        f"<tr><td>trial {n} ({html.escape(label)})</td>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for n, label, row in rows
    )
    head = "".join(f"<th>{html.escape(m)}</th>" for m in metrics)
    table = f"<table><tr><th>config</th>{head}</tr>{cells}</table>" if rows else ""
    return _best_vs_default(table, html.escape(no_verdict_yet(study_attrs_of(study))))


def _best_vs_default(table: str, text: str, after: str = "") -> str:
    return (f'<section id="best-vs-default"><h2>Winner against the engine default</h2>'
            f"<p>mean [95 % interval] over fresh-boot repeats</p>{table}<p>{text}</p>{after}</section>")  # fmt: skip


def finalist_rows(study: optuna.Study) -> tuple[list[str], list[tuple[int, str, list[str]]]]:
    """The deciding metrics, and per finalist (number, ``vllm defaults`` or ``sglang tuned``, a cell
    per metric): its mean [95 % interval] once the stage ended, the repeats stored so far while it
    runs (on a GPU it spans leases), and those withdrawn (``repeats_cell``)."""
    attrs = study_attrs_of(study)
    runs, withdrawn = attrs.get("finalist_runs") or {}, attrs.get("finalist_runs_withdrawn") or {}
    ended = {int(f["trial"]): f for f in attrs.get("finalists") or [] if isinstance(f, dict) and "trial" in f}
    numbers = list(dict.fromkeys([*ended, *(int(n) for n in runs), *(int(n) for n in withdrawn)]))
    metrics = list(objective_named(attrs.get("objective")).deciders(bool(attrs.get("slo"))))
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    rows = []
    for n in numbers:
        trial = by_number.get(n)
        kind = "defaults" if trial is not None and is_default(trial) else "tuned"
        engine = engine_of(trial) if trial is not None else "?"
        cells = [repeats_cell(ended.get(n), m, runs.get(str(n)) or [], len(withdrawn.get(str(n)) or []))
                 for m in metrics]  # fmt: skip
        rows.append((n, f"{engine} {kind}", cells))
    return metrics, rows


def finalists_md(study: optuna.Study) -> list[str]:
    """The finalists' fresh-boot repeats as Markdown, for ``summary.md`` (``finalist_rows``), then the
    verdict on each metric."""
    metrics, rows = finalist_rows(study)
    if not rows:
        return []
    lines = ["", "## The finalists' fresh-boot repeats", "",
             "| trial | config | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]  # fmt: skip
    lines += [f"| {n} | {label} | " + " | ".join(cells) + " |" for n, label, cells in rows]
    verdict = study_attrs_of(study).get("verdict")
    if isinstance(verdict, dict):
        lines += [""] + [f"- {m}: {describe_verdict(v)}" for m, v in verdicts_by_metric(verdict).items()]
    again = reread_lines(study)
    return lines + (["", again[0], ""] + [f"- {line}" for line in again[1:]] if again else [])


def failure_map_section(study: optuna.Study, ranked: list[str]) -> str:
    params = [p for p in ranked if p != "engine"][:2]
    if len(params) < 2:
        return '<section id="failure-map"><h2>Failure map</h2><p>too few parameters</p></section>'
    mapped = [t for t in _completed(study) if all(p in t.params for p in params)]
    points = [
        Point(
            _axis_value(t.params[x]),
            _axis_value(t.params[y]),
            _about(t),
            str(trial_attrs(t).get("failure") or "served"),
        )
        for t in mapped
        for x, y in [params]
    ]
    logs = tuple(bool(mapped) and getattr(mapped[0].distributions[p], "log", False) is True for p in params)
    title = " × ".join(params)
    plot = (
        scatter(points, title, params[0], params[1], "failure-map-plot", (logs[0], logs[1]))
        if points
        else "<p>no trials</p>"
    )
    return f'<section id="failure-map"><h2>Failure map over {html.escape(title)}</h2>{plot}</section>'


def _axis_value(value: Any) -> float | str:
    """A number as a number (six digits: no sampler noise in the data), a categorical choice as a category."""
    return float(f"{value:.6g}") if isinstance(value, int | float) and not isinstance(value, bool) else str(value)


def acceptance_section(study: optuna.Study) -> str:
    """Acceptance by engine, method, draft or head, and K: the mean over the trials that served (a
    pruned trial served its steps too, and a method that accepts nothing is mostly pruned), from each
    trial's ``speculation`` attribute (the engine's own counters), with its mean accepted length. The
    engines are kept apart: the same draft need not be accepted alike by two engines' verifiers."""
    groups: dict[tuple[str, str, str, int], list[tuple[float, float | None]]] = defaultdict(list)
    served = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for t in study.get_trials(deepcopy=False, states=served):
        spec = trial_attrs(t).get("speculation") or {}
        rate, length = spec.get("acceptance_rate"), spec.get("mean_accept_len")
        if isinstance(rate, int | float) and spec.get("num_speculative_tokens"):
            k = int(spec["num_speculative_tokens"])
            key = (engine_of(t), str(spec.get("method")), str(spec.get("draft") or "-"), k)
            groups[key].append((float(rate), length if isinstance(length, int | float) else None))
    rows = "".join(
        f"<tr><td>{html.escape(e)}</td><td>{html.escape(m)}</td><td>{html.escape(d)}</td><td>{k}</td>"
        f"<td>{_mean([r for r, _ in v]):.1%}</td><td>{_length([n for _, n in v])}</td><td>{len(v)}</td></tr>"
        for (e, m, d, k), v in sorted(groups.items())
    )
    columns = ("engine", "method", "draft or head", "K", "acceptance", "accepted length", "trials")
    head = "<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"
    body = f"<table>{head}{rows}</table>" if rows else "<p>no speculative trial served</p>"
    title = "Speculative acceptance by engine, method, draft or head, and K"
    return f'<section id="acceptance"><h2>{title}</h2>{body}</section>'


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _length(values: list[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{_mean(known):.2f}" if known else "-"


def prediction_section(study: optuna.Study) -> str:
    """``--sampler model``: each trial's capacity as predicted before it booted, against the measured one."""
    if not has_predictions(study):
        return ""
    tier = tiers(study)[0].name
    rows = []
    for t in study.get_trials(deepcopy=False):
        said, found = predicted(t, tier), tier_capacity(t, tier)
        if not said:
            continue
        central = predicted_claim(said)
        error = f"{central / found - 1:+.0%}" if central is not None and found else "-"
        rows.append(f"<tr><td>{t.number}</td><td>{html.escape(predicted_cell(t, tier))}</td>"
                    f"<td>{'-' if found is None else number(found)}</td><td>{error}</td>"
                    f"<td>{html.escape(str(said.get('basis') or ''))}</td></tr>")  # fmt: skip
    head = "<tr><th>trial</th><th>predicted req/s</th><th>measured req/s</th><th>error</th><th>basis</th></tr>"
    return (f'<section id="predicted"><h2>Predicted against measured capacity ({html.escape(tier)} tier)</h2>'
            f"<table>{head}{''.join(rows)}</table></section>")  # fmt: skip


def launch_section(study: optuna.Study) -> str:
    said, trials = launch_choice(study)
    commands = "".join(
        f"<p>{html.escape(engine_line(t))}</p><pre>{html.escape(launch_command(t))}</pre>" for t in trials
    )
    note = "<p>the command <code>tuner export --format sh</code> runs, less the address it adds</p>"
    return (f'<section id="launch"><h2>Launch command of the winner</h2><p>{html.escape(said)}</p>'
            f"{commands}{note if trials else ''}</section>")  # fmt: skip


def _intro(study: optuna.Study) -> str:
    attrs: dict[str, Any] = study.user_attrs
    about = {key: attrs.get(key) for key in ("objective", "workload", "model")}
    about |= {"hardware": (attrs.get("hardware") or {}).get("name"), "engines": engines_text(attrs.get("engines"))}
    facts = ", ".join(f"{k} {html.escape(str(v))}" for k, v in about.items() if v)
    return f"<h1>Study {html.escape(study.study_name)}</h1><p>{facts}</p>"


def write_report(study: optuna.Study, out_root: Path, gpu_price: float | None = None) -> Path:
    """The study's report; ``gpu_price`` (USD per GPU-hour) overrides the study's own for the costs."""
    found = importances(study)  # PED-ANOVA over every trial: computed once for both sections
    capacity = is_capacity_study(study)
    price = study_price(study, gpu_price)
    if capacity:
        first = [capacity_section(study), capacity_table_section(study, price), prediction_section(study),
                 engines_section(study, price)]  # fmt: skip
    else:
        first = [pareto_section(study), cdf_section(study)]
    sections = [*first, costs_section(study), importance_section(found, capacity, len(_completed(study))),
                best_vs_default_section(study, price), failure_map_section(study, list(found)),
                acceptance_section(study), overrides_section(study), verified_section(study),
                launch_section(study)]  # fmt: skip
    out = out_root / safe_name(study.study_name)
    out.mkdir(parents=True, exist_ok=True)
    page = f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(study.study_name)}</title>'
    page += f"<style>{CSS}</style>{plotly_script()}</head><body>{_intro(study)}{''.join(sections)}</body></html>\n"
    (out / "index.html").write_text(page, encoding="utf-8")
    (out / "summary.md").write_text(summary_md(study, price), encoding="utf-8")
    return out / "index.html"


def summary_md(study: optuna.Study, price: float | None = None) -> str:
    """The report's figures as Markdown, which the GPU reports are written from; ``price`` (USD per
    GPU-hour) prices each engine's best per tier."""
    front = [t.number for t in feasible_pareto(study)]
    lines = [f"# Study {study.study_name}", "", f"- workload: {study_attrs_of(study).get('workload')}",
             f"- trials: {len(study.trials)}, feasible Pareto front: {front}"]  # fmt: skip
    verdict = study_attrs_of(study).get("verdict")
    if verdict:
        lines.append(f"- {describe_verdict(verdict)}")
    if is_capacity_study(study):
        lines += engines_md(study, price)
    lines += finalists_md(study) + costs_md(study) + overrides_md(study) + verified_md(study)
    said, trials = launch_choice(study)
    lines += ["", "## Launch command of the winner", "", said]
    for t in trials:
        lines += ["", engine_line(t), "", "```", launch_command(t), "```"]
    return "\n".join(lines) + "\n"
