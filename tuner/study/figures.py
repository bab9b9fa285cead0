"""How a measured figure is written wherever the tuner shows one: the report, `tuner trials`, and the
provenance of every launch file, so a capacity reads alike in each (``6.65``, not ``6.7`` in one and
``6.65`` in another: two configs a rung apart on the ladder differ in the second decimal)."""

from __future__ import annotations


def number(value: float) -> str:
    """A measured figure: three significant digits, whole numbers from 100 up."""
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"
