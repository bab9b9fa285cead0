"""Small inline-SVG plots for the HTML report: scatter and step (CDF) charts, no plotting library.

Every text is escaped; the SVG is self-contained, so the report is one file that a browser renders
without loading anything.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

W, H, PAD = 560, 320, 48
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    label: str
    group: str


def _scale(values: Sequence[float], lo_px: float, hi_px: float) -> tuple[float, float, float, float]:
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 1.0, hi + 1.0
    return lo, hi, lo_px, hi_px


def _map(v: float, s: tuple[float, float, float, float]) -> float:
    lo, hi, a, b = s
    return a + (v - lo) / (hi - lo) * (b - a)


def _frame(title: str, x_label: str, y_label: str, sx: tuple[float, ...], sy: tuple[float, ...]) -> list[str]:
    esc = html.escape
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" role="img" aria-label="{esc(title)}">',
        f'<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>',
        f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="black"/>',
        f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{H - PAD}" stroke="black"/>',
        f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle" font-size="12">{esc(x_label)}</text>',
        f'<text x="12" y="{H / 2}" font-size="12" transform="rotate(-90 12 {H / 2})" text-anchor="middle">'
        f"{esc(y_label)}</text>",
        f'<text x="{PAD}" y="{H - PAD + 14}" font-size="10">{sx[0]:.4g}</text>',
        f'<text x="{W - 10}" y="{H - PAD + 14}" font-size="10" text-anchor="end">{sx[1]:.4g}</text>',
        f'<text x="{PAD - 4}" y="{H - PAD}" font-size="10" text-anchor="end">{sy[0]:.4g}</text>',
        f'<text x="{PAD - 4}" y="16" font-size="10" text-anchor="end">{sy[1]:.4g}</text>',
    ]


def scatter(points: Sequence[Point], title: str, x_label: str, y_label: str) -> str:
    sx = _scale([p.x for p in points], PAD, W - 20)
    sy = _scale([p.y for p in points], H - PAD, 20)
    parts = _frame(title, x_label, y_label, sx, sy)
    groups = sorted({p.group for p in points})
    for p in points:
        color = COLORS[groups.index(p.group) % len(COLORS)]
        cx, cy = _map(p.x, sx), _map(p.y, sy)
        parts.append(
            f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}"><title>{html.escape(p.label)}</title></circle>'
        )
    parts += _legend(groups)
    return "\n".join([*parts, "</svg>"])


def cdf(series: dict[str, Sequence[float]], title: str, x_label: str) -> str:
    values = [v for s in series.values() for v in s]
    sx, sy = _scale(values, PAD, W - 20), _scale([0.0, 1.0], H - PAD, 20)
    parts = _frame(title, x_label, "fraction of requests", sx, sy)
    names = sorted(series)
    for name in names:
        data = sorted(series[name])
        pts = " ".join(f"{_map(v, sx):.1f},{_map((i + 1) / len(data), sy):.1f}" for i, v in enumerate(data))
        color = COLORS[names.index(name) % len(COLORS)]
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{pts}"/>')
    parts += _legend(names)
    return "\n".join([*parts, "</svg>"])


def _legend(groups: Sequence[str]) -> list[str]:
    out = []
    for i, group in enumerate(groups):
        y = 20 + 14 * i
        out.append(f'<rect x="{W - 170}" y="{y - 9}" width="10" height="10" fill="{COLORS[i % len(COLORS)]}"/>')
        out.append(f'<text x="{W - 155}" y="{y}" font-size="11">{html.escape(group)}</text>')
    return out
