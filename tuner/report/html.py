"""``tuner report --study NAME``: ``reports/<study>/index.html`` (inline SVG plots) and ``summary.md``.

Sections: the Pareto front with infeasible trials marked by failure class; the TTFT CDFs of the
finalists; parameter importance (Optuna's PED-ANOVA on output throughput); the winner against the
engine default with the repeats' 95 % intervals; the failure map over the two most important
parameters; speculative acceptance by draft model and K; the exact launch command of the winner.

The rest of the HTML report: winner against default, failure map, acceptance, launch command; writing.
"""

from __future__ import annotations

import html
import shlex
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

import optuna

from tuner.naming import safe_name
from tuner.report.plots import Point, cdf, scatter
from tuner.study.feasible import feasible_pareto
from tuner.study.verdict import describe_verdict

Trial = optuna.trial.FrozenTrial


def _completed(study: optuna.Study) -> list[Trial]:
    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))


def _name(t: Trial) -> str:
    return f"trial {t.number}" + (" (engine default)" if t.user_attrs.get("config_kind") == "engine_default" else "")


def pareto_section(study: optuna.Study) -> str:
    front = {t.number for t in feasible_pareto(study)}
    points = [
        Point(t.user_attrs["ttft_p95_ms"], t.user_attrs["output_throughput_tok_s"], _name(t),
              "Pareto front" if t.number in front else "feasible")
        for t in _completed(study) if t.user_attrs.get("failure") is None and t.user_attrs.get("ttft_p95_ms")
    ]  # fmt: skip
    failed = [t for t in _completed(study) if t.user_attrs.get("failure")]
    rows = "".join(f"<tr><td>{t.number}</td><td>{html.escape(str(t.user_attrs['failure']))}</td>"
                   f"<td>{html.escape(_params(t))}</td></tr>" for t in failed)  # fmt: skip
    plot = scatter(points, "Pareto front", "TTFT p95 (ms)", "output throughput (tok/s)") if points else ""
    table = f"<table><tr><th>trial</th><th>failure class</th><th>params</th></tr>{rows}</table>" if failed else ""
    return f'<section id="pareto"><h2>Pareto front</h2>{plot}<h3>Infeasible trials</h3>{table or "none"}</section>'


def _params(t: Trial) -> str:
    return " ".join(f"{k}={v}" for k, v in t.params.items())


def cdf_section(study: optuna.Study) -> str:
    series = {f"trial {f['trial']}": f["ttft_samples_ms"] for f in study.user_attrs.get("finalists", [])
              if f.get("ttft_samples_ms")}  # fmt: skip
    if not series:  # no repeats ran: fall back to the front's own runs
        series = {_name(t): t.user_attrs.get("ttft_samples_ms") or [] for t in feasible_pareto(study)}
        series = {k: v for k, v in series.items() if v}
    body = cdf(series, "TTFT CDF", "TTFT (ms)") if series else "<p>no TTFT samples recorded</p>"
    return f'<section id="ttft-cdf"><h2>TTFT of the finalists</h2>{body}</section>'


def importances(study: optuna.Study) -> dict[str, float]:
    sampled = [t for t in _completed(study) if t.user_attrs.get("config_kind") == "sampled"]
    if len(sampled) < 2:
        return {}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # few trials: the evaluator warns, the ranking is still the best we have
            return optuna.importance.get_param_importances(
                study, target=lambda t: float(t.user_attrs.get("output_throughput_tok_s") or 0.0)
            )
    except (ValueError, RuntimeError):
        return {}


def importance_section(found: dict[str, float]) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{v:.3f}</td></tr>" for k, v in found.items())
    body = f"<table><tr><th>parameter</th><th>importance</th></tr>{rows}</table>" if rows else "<p>too few trials</p>"
    return f'<section id="importance"><h2>Parameter importance (output throughput)</h2>{body}</section>'


# ---- from report_write ----
METRICS = ("ttft_p95_ms", "tpot_p95_ms", "output_throughput_tok_s", "goodput_req_s")
CSS = (
    "body{font-family:sans-serif;margin:2em;max-width:70em}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px}"
    "pre{white-space:pre-wrap;word-break:break-all;background:#f6f6f6;padding:8px}"
)


def winner_trial(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    verdict = study.user_attrs.get("verdict") or {}
    numbers = verdict.get("trials") or [t.number for t in feasible_pareto(study)][-1:]
    return next((t for t in study.get_trials(deepcopy=False) if numbers and t.number == numbers[0]), None)


def best_vs_default_section(study: optuna.Study) -> str:
    finalists = study.user_attrs.get("finalists", [])
    head = "".join(f"<th>{m}</th>" for m in METRICS)
    rows = []
    for f in finalists:
        cells = "".join(
            f"<td>{s['mean']:.1f} [{s['low']:.1f}, {s['high']:.1f}]</td>" if (s := f["stats"].get(m)) else "<td>-</td>"
            for m in METRICS
        )
        kind = "engine default" if f.get("config_kind") == "engine_default" else "tuned"
        rows.append(f"<tr><td>trial {f['trial']} ({kind})</td>{cells}</tr>")
    verdict = study.user_attrs.get("verdict")
    text = html.escape(describe_verdict(verdict)) if verdict else "no finalist repeats were run"
    table = f"<table><tr><th>config</th>{head}</tr>{''.join(rows)}</table>" if rows else ""
    return (f'<section id="best-vs-default"><h2>Winner against the engine default</h2>'
            f"<p>mean [95 % t-interval] over fresh-boot repeats</p>{table}<p>{text}</p></section>")  # fmt: skip


def failure_map_section(study: optuna.Study, ranked: list[str]) -> str:
    params = [p for p in ranked if p != "engine"][:2]
    if len(params) < 2:
        return '<section id="failure-map"><h2>Failure map</h2><p>too few parameters</p></section>'
    points = []
    for t in _completed(study):
        if all(p in t.params for p in params):
            x, y = (_numeric(study, t, p) for p in params)
            points.append(Point(x, y, f"trial {t.number}", str(t.user_attrs.get("failure") or "served")))
    plot = scatter(points, "failure map", params[0], params[1]) if points else "<p>no trials</p>"
    return f'<section id="failure-map"><h2>Failure map over {html.escape(" × ".join(params))}</h2>{plot}</section>'


def _numeric(study: optuna.Study, t: optuna.trial.FrozenTrial, param: str) -> float:
    value = t.params[param]
    if isinstance(value, int | float):
        return float(value)
    dist = t.distributions[param]
    return float(dist.to_internal_repr(value))  # a categorical's index


def acceptance_section(study: optuna.Study) -> str:
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for t in _completed(study):
        config, rate = t.user_attrs.get("config") or {}, (t.user_attrs.get("server") or {}).get("spec_acceptance_rate")
        if rate is not None and config.get("num_speculative_tokens"):
            groups[(str(config.get("draft_model")), int(config["num_speculative_tokens"]))].append(rate)
    rows = "".join(
        f"<tr><td>{html.escape(d)}</td><td>{k}</td><td>{sum(v) / len(v):.1%}</td><td>{len(v)}</td></tr>"
        for (d, k), v in sorted(groups.items())
    )
    body = (
        f"<table><tr><th>draft</th><th>K</th><th>acceptance</th><th>trials</th></tr>{rows}</table>"
        if rows
        else "<p>no speculative trial served</p>"
    )
    return f'<section id="acceptance"><h2>Speculative acceptance by draft model and K</h2>{body}</section>'


def launch_section(winner: optuna.trial.FrozenTrial | None) -> str:
    command = shlex.join(winner.user_attrs.get("argv", [])) if winner else "no feasible trial"
    title = f"trial {winner.number}" if winner else ""
    return (
        f'<section id="launch"><h2>Launch command of the winner {title}</h2><pre>{html.escape(command)}</pre></section>'
    )


def write_report(study: optuna.Study, out_root: Path) -> Path:
    found = importances(study)  # PED-ANOVA over every trial: computed once for both sections
    winner = winner_trial(study)
    attrs: dict[str, Any] = study.user_attrs
    about = {"workload": attrs.get("workload"), "model": attrs.get("model"),
             "hardware": (attrs.get("hardware") or {}).get("name"), "engines": attrs.get("engines")}  # fmt: skip
    facts = ", ".join(f"{k} {html.escape(str(v))}" for k, v in about.items())
    intro = f"<h1>Study {html.escape(study.study_name)}</h1><p>{facts}</p>"
    sections = [pareto_section(study), cdf_section(study), importance_section(found),
                best_vs_default_section(study), failure_map_section(study, list(found)), acceptance_section(study),
                launch_section(winner)]  # fmt: skip
    out = out_root / safe_name(study.study_name)
    out.mkdir(parents=True, exist_ok=True)
    page = f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(study.study_name)}</title>'
    page += f"<style>{CSS}</style></head><body>{intro}{''.join(sections)}</body></html>\n"
    (out / "index.html").write_text(page)
    (out / "summary.md").write_text(summary_md(study, winner))
    return out / "index.html"


def summary_md(study: optuna.Study, winner: optuna.trial.FrozenTrial | None) -> str:
    front = [t.number for t in feasible_pareto(study)]
    lines = [f"# Study {study.study_name}", "", f"- workload: {study.user_attrs.get('workload')}",
             f"- trials: {len(study.trials)}, feasible Pareto front: {front}"]  # fmt: skip
    verdict = study.user_attrs.get("verdict")
    if verdict:
        lines.append(f"- {describe_verdict(verdict)}")
    if winner is not None:
        lines += ["", "Launch command of the winner:", "", "```", shlex.join(winner.user_attrs.get("argv", [])), "```"]
    return "\n".join(lines) + "\n"
