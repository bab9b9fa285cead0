"""``tuner report --study NAME``: ``reports/<study>/index.html`` (inline SVG plots) and ``summary.md``.

Sections: the Pareto front with infeasible trials marked by failure class; the TTFT CDFs of the
finalists; parameter importance (Optuna's PED-ANOVA on output throughput); the winner against the
engine default with the repeats' 95 % intervals; the failure map over the two most important
parameters; speculative acceptance by draft model and K; the exact launch command of the winner.
"""

from __future__ import annotations

import html
import warnings

import optuna

from tuner.feasible import feasible_pareto
from tuner.svg import Point, cdf, scatter

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
