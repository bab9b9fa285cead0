"""The report's plots, drawn with Plotly: scatter, CDF and capacity curves, each a ``<div>``.

The figures carry only their data; ``plotly_script`` is the whole plotly.js bundle, which the page inlines
once, so the report stays one file that a browser shows with no network. Hovering a point shows its
trial and parameters. Hover texts are Plotly's HTML subset: callers pass them escaped.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

CONFIG = {"displaylogo": False, "responsive": True}
HEIGHT = 440
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
HOVER = "%{text}<extra></extra>"


@dataclass(frozen=True)
class Point:
    x: float | str  # a categorical parameter's choice is drawn on a category axis
    y: float | str
    about: str  # hover text: the trial and its parameters, escaped
    group: str


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float]
    about: str


@dataclass(frozen=True)
class RateStep:
    rate_req_s: float
    attainment: float | None
    ttft_p95_ms: float | None
    tpot_p95_ms: float | None
    passed: bool
    note: str  # passed/failed/undecided, saturated, collapsed, the attainment interval
    attainment_low: float | None = None  # the attainment's interval (an older study's steps have none)
    attainment_high: float | None = None


@dataclass(frozen=True)
class Curve:
    name: str
    about: str  # hover text: the trial's parameters, escaped
    steps: Sequence[RateStep]  # sorted by rate
    capacity_req_s: float | None
    is_default: bool  # drawn dashed


def plotly_script() -> str:
    """plotly.js, inline: the one script every figure of the page draws with."""
    return f'<script type="text/javascript">{get_plotlyjs()}</script>'


def _div(fig: go.Figure, div_id: str) -> str:
    fig.update_layout(template="plotly_white", margin={"t": 50, "r": 20})
    return str(fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG))


def scatter(
    points: Sequence[Point],
    title: str,
    x_label: str,
    y_label: str,
    div_id: str,
    logs: tuple[bool, bool] = (False, False),
) -> str:
    fig = go.Figure()
    for group in sorted({p.group for p in points}):
        mine = [p for p in points if p.group == group]
        fig.add_trace(go.Scatter(x=[p.x for p in mine], y=[p.y for p in mine], mode="markers", name=group,
                                 text=[p.about for p in mine], hovertemplate=HOVER, marker={"size": 9}))  # fmt: skip
    fig.update_layout(title=title, height=HEIGHT, showlegend=True)
    fig.update_xaxes(title_text=x_label, type="log" if logs[0] else None)
    fig.update_yaxes(title_text=y_label, type="log" if logs[1] else None)
    return _div(fig, div_id)


def cdf(series: Sequence[Series], title: str, x_label: str, div_id: str) -> str:
    fig = go.Figure()
    for s in series:
        data = sorted(v for v in s.values if math.isfinite(v))
        shares = [(i + 1) / len(data) for i in range(len(data))]
        hover = f"{s.about}<br>%{{y:.1%}} of requests within %{{x:.4g}} ms<extra></extra>"
        fig.add_trace(go.Scatter(x=data, y=shares, mode="lines", name=s.name, line_shape="hv", hovertemplate=hover))
    fig.update_layout(title=title, height=HEIGHT, showlegend=True)
    fig.update_xaxes(title_text=x_label)
    fig.update_yaxes(title_text="share of requests", tickformat=".0%", range=[0, 1.02])
    return _div(fig, div_id)


def _fmt(value: float | None, fmt: str, unit: str) -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


def _step_text(curve: Curve, s: RateStep) -> str:
    return (f"<b>{html.escape(curve.name)}</b><br>{s.rate_req_s:.4g} req/s: {html.escape(s.note)}<br>"
            f"attainment {_fmt(s.attainment, '.1%', '')}, TTFT p95 {_fmt(s.ttft_p95_ms, '.4g', ' ms')}, "
            f"TPOT p95 {_fmt(s.tpot_p95_ms, '.3g', ' ms')}<br>{curve.about}")  # fmt: skip


ROWS = (("attainment", "SLO attainment"), ("ttft_p95_ms", "TTFT p95 (ms)"), ("tpot_p95_ms", "TPOT p95 (ms)"))
BOUNDS = {"ttft_p95_ms": (2, "TTFT p95"), "tpot_p95_ms": (3, "TPOT p95")}  # the SLO bound drawn on each row


def capacity_figure(curves: Sequence[Curve], target: float | None, slo: dict[str, float], div_id: str) -> str:
    """Attainment, TTFT p95 and TPOT p95 against the request rate, one row each, with the target and the
    SLO bounds as horizontal lines and each curve's capacity starred on the attainment row."""
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.05)
    for i, curve in enumerate(curves):
        line = {"color": COLORS[i % len(COLORS)], "dash": "dash" if curve.is_default else "solid"}
        shared = {"name": curve.name, "legendgroup": curve.name, "mode": "lines+markers", "line": line,
                  "text": [_step_text(curve, s) for s in curve.steps], "hovertemplate": HOVER, "connectgaps": True,
                  "marker": {"symbol": ["circle" if s.passed else "x" for s in curve.steps], "size": 8}}  # fmt: skip
        rates = [s.rate_req_s for s in curve.steps]
        for row, (key, _) in enumerate(ROWS, start=1):
            ys = [getattr(s, key) for s in curve.steps]
            extra = {"error_y": _interval_bars(curve.steps)} if key == "attainment" else {}
            fig.add_trace(go.Scatter(x=rates, y=ys, showlegend=row == 1, **shared, **extra), row=row, col=1)
        _star_capacity(fig, curve, line["color"])
    _bounds(fig, curves, target, slo)
    fig.update_layout(height=3 * 300, hovermode="closest")
    fig.update_xaxes(title_text="request rate (req/s)", row=3, col=1)
    for row, (key, label) in enumerate(ROWS, start=1):
        fig.update_yaxes(title_text=label, row=row, col=1, **_axis(key))
    return _div(fig, div_id)


def _interval_bars(steps: Sequence[RateStep]) -> dict[str, Any]:
    """Each step's attainment interval as asymmetric error bars (none where a step has no interval)."""
    up = [s.attainment_high - s.attainment if s.attainment_high is not None and s.attainment is not None else 0.0
          for s in steps]  # fmt: skip
    down = [s.attainment - s.attainment_low if s.attainment_low is not None and s.attainment is not None else 0.0
            for s in steps]  # fmt: skip
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "width": 3}


def _axis(key: str) -> dict[str, Any]:
    if key == "attainment":
        return {"tickformat": ".0%", "range": [0, 1.05]}
    # past capacity latencies grow by orders of magnitude; a labelled tick at every doubling
    return {"type": "log", "dtick": math.log10(2), "tickformat": "~g"}


def _star_capacity(fig: go.Figure, curve: Curve, color: str) -> None:
    if not curve.capacity_req_s:
        return
    at = next((s.attainment for s in curve.steps if math.isclose(s.rate_req_s, curve.capacity_req_s)), None)
    text = f"<b>{html.escape(curve.name)}</b><br>capacity {curve.capacity_req_s:.4g} req/s<br>{curve.about}"
    star = {"symbol": "star", "size": 16, "color": color, "line": {"color": "black", "width": 1}}
    y = at if at is not None else 1.0
    fig.add_trace(go.Scatter(x=[curve.capacity_req_s], y=[y], mode="markers", name=f"capacity of {curve.name}",
                             legendgroup=curve.name, showlegend=False, text=[text], hovertemplate=HOVER, marker=star),
                  row=1, col=1)  # fmt: skip


def _bounds(fig: go.Figure, curves: Sequence[Curve], target: float | None, slo: dict[str, float]) -> None:
    """Horizontal lines as traces (in the legend, and right on a log axis) across the rates measured."""
    rates = [s.rate_req_s for c in curves for s in c.steps]
    lines = [(1, target, f"target {target:.0%}")] if target is not None else []
    lines += [(row, slo[key], f"{label} bound {slo[key]:g} ms") for key, (row, label) in BOUNDS.items() if key in slo]
    for row, value, name in lines:
        dotted = {"color": "black", "dash": "dot", "width": 1}
        across = go.Scatter(x=[min(rates), max(rates)], y=[value, value], mode="lines", name=name, line=dotted)
        fig.add_trace(across, row=row, col=1)
