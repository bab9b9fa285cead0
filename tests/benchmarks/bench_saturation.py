"""The saturation test of a capacity step, on a continuous-batching server whose truth is known.

Run: ``.venv/bin/python -m tests.benchmarks.bench_saturation [--seeds N]`` (a few minutes; no engine).
Not part of the default test run. Writes the section "saturation" of ``reports/capacity.md``.

A step's monitor cuts a step as saturated when the requests in flight keep piling up
(``tuner.measure.capacity.saturated``). On the H200 it cut steps that vLLM's own client then carried
at 1.2x their rate (reports/gpu-h200/capacity-check-5/NOTES.md): `rag`'s answers live seconds, and
longer as the batch grows. This replays that shape on ``tests/batching_server.py``, where a rate is
carried or not by construction (its token rate against the server's), and counts, per rate and over
seeded steps, the steps cut by 27 s and by 50 s, the test judged when the monitor judges it
(``tuner.measure.capacity.saturation_due``, on the monitor's ticks): under the current rule and under
those it replaced, kept only to compare: *every tick* (capacity check 8's: the same test, judged at
every tick of the monitor), *halves* (capacity check 6's: growth over the judged window and each of its
halves, through ``tests/benchmarks/_previous_rules.py``, every tick) and *first*, which this file keeps
(capacity check 5's: the climb read from the longest lifetime of the step's first quarter of requests,
growth judged over one window, every tick).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tests.batching_server import batched_rows, carried
from tests.benchmarks import _report
from tests.benchmarks._previous_rules import saturation_parts
from tuner.measure.capacity import MIN_WATCH_S, SATURATION_SAMPLES, _end_s, growing, saturated, saturation_due
from tuner.measure.rate_steps import MONITOR_EVERY_S, CapacityPlan, seen_at

NAME = "saturation"
MD_PATH, JSON_PATH = _report.ROOT / "reports" / "capacity.md", _report.ROOT / "reports" / "capacity.json"
RATES = (3.0, 5.33, 8.0, 10.0, 13.0, 15.0, 20.0)
SHORT_S, LONG_S = 27.0, 50.0  # by the end of a 30 s step's serving, and of a GPU step's (3 looks of 15 s)
TICKS = tuple(MONITOR_EVERY_S * i for i in range(1, int(LONG_S / MONITOR_EVERY_S) + 1))
WARMUP_S = 1.5
PLAN = CapacityPlan(tiers={}, scored=())  # the monitor's rules, whatever the tiers
PREVIOUS_SHARE = 0.25  # the replaced rule: the first quarter of the time's requests told the climb

Row = dict[str, Any]


def halves_saturated(rows: Sequence[Row], start_s: float, end_s: float, min_span_s: float) -> bool:
    """Capacity check 6's rule: growth over the window and over each of its halves, two sigmas each."""
    with saturation_parts(2, 2.0):
        return saturated(rows, start_s, end_s, min_span_s=min_span_s)


def first_saturated(rows: Sequence[Row], start_s: float, end_s: float, min_span_s: float) -> bool:
    """Capacity check 5's rule: from the longest lifetime of the first requests (none while one still runs),
    in-flight growing over one window."""
    if not rows:
        return False
    first = min(float(r["sent_s"]) for r in rows)
    early = [r for r in rows if float(r["sent_s"]) <= first + PREVIOUS_SHARE * (end_s - first)]
    if any(r.get("done_s") is None and r.get("error") is None for r in early):
        return False
    lives = [float(r["done_s"]) - float(r["sent_s"]) for r in early if r.get("done_s") is not None]
    start = max(start_s, first + max(lives, default=0.0))
    span = end_s - start
    if span <= 0 or span < min_span_s:
        return False
    sent = np.array([float(r["sent_s"]) for r in rows])
    ends = np.array([_end_s(r) for r in rows])
    times = np.linspace(start, end_s, SATURATION_SAMPLES)
    in_flight = ((sent[None, :] <= times[:, None]) & (ends[None, :] > times[:, None])).sum(axis=1)
    rate = float(((sent >= start) & (sent <= end_s)).sum()) / span
    return growing(times, in_flight.astype(float), rate)


def checks(every_s: float) -> list[float]:
    """The monitor's ticks at which the test is judged, judged every ``every_s`` (0: every tick)."""
    return [t for t, last in zip(TICKS, (0.0, *TICKS), strict=False) if saturation_due(last, t, every_s)]


def current(rows: Sequence[Row], start: float, end: float, span: float) -> bool:
    return saturated(rows, start, end, min_span_s=span)


# rule -> (test, how often it is judged)
RULES: dict[str, tuple[Callable[[Sequence[Row], float, float, float], bool], float]] = {
    "current": (current, PLAN.saturation_every_s),
    "every tick": (current, 0.0),
    "halves": (halves_saturated, 0.0),
    "first": (first_saturated, 0.0),
}


def first_cut(rows: list[Row], rule: str) -> float | None:
    """When the rule's monitor first cut the step (None: not by ``LONG_S``)."""
    test, every_s = RULES[rule]
    return next((now for now in checks(every_s) if test(seen_at(rows, now), WARMUP_S, now, MIN_WATCH_S)), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=30)
    args = parser.parse_args()
    run_stamp, before = _report.stamp(), _report.machine()
    data: list[dict[str, Any]] = []
    for rate in RATES:
        counts = {f"{rule}_{until}": 0 for rule in RULES for until in ("27s", "50s")}
        cut_at: dict[str, list[float]] = {rule: [] for rule in RULES}
        for seed in range(args.seeds):
            rows = batched_rows(rate, LONG_S + 1.0, seed)
            for rule in RULES:
                cut = first_cut(rows, rule)
                counts[f"{rule}_27s"] += cut is not None and cut <= SHORT_S
                counts[f"{rule}_50s"] += cut is not None
                cut_at[rule] += [] if cut is None else [cut]
        data.append({"rate_req_s": rate, "carried": carried(rate), **counts, "cut_at_s": cut_at})
    after = _report.machine()
    n = args.seeds
    rows_md = [
        [f"{d['rate_req_s']:g}", "yes" if d["carried"] else "no"]
        + [f"{d[f'{rule}_{until}']}/{n}" for until in ("27s", "50s") for rule in RULES]
        for d in data
    ]  # fmt: skip
    wrong = {rule: sum(d[f"{rule}_27s"] if d["carried"] else n - d[f"{rule}_27s"] for d in data) for rule in RULES}
    carried_n = n * sum(d["carried"] for d in data)
    # a false cut fails a rate the server carries, and the search's answer with it; a late cut of a
    # rate it does not carry costs seconds of the step, which its attainment and end-of-step test judge
    false_cuts = {rule: sum(d[f"{rule}_50s"] for d in data if d["carried"]) for rule in RULES}
    late = {
        rule: statistics.median([t for d in data if not d["carried"] for t in d["cut_at_s"][rule]] or [math.nan])
        for rule in RULES
    }
    header = ["rate (req/s)", "carried"] + [
        f"cut by {until:g} s: {rule}" if i == 0 else rule for until in (SHORT_S, LONG_S) for i, rule in enumerate(RULES)
    ]
    markdown = "\n\n".join([
        "## The saturation test (`bench_saturation`)",
        f"{n} seeded Poisson steps per rate on `tests/batching_server.py` (answers of 256-768 tokens; an "
        "iteration's time grows with its batch; it carries a rate whose tokens are under its token rate). "
        f"A cell is the steps the monitor cut as saturated by {SHORT_S:g} s and by {LONG_S:g} s, judged from "
        f"warm-up {WARMUP_S:g} s over at least {MIN_WATCH_S:g} s, on the monitor's ticks (every "
        f"{MONITOR_EVERY_S:g} s). A cut of a carried rate is a false fail; no cut of a rate not carried leaves "
        "the step to its attainment and its end-of-step test. *current*: growth over the judged window and "
        f"each of its thirds, judged every {PLAN.saturation_every_s:g} s; *every tick*: the same test judged "
        "at every tick (capacity check 8); *halves*: the rule of capacity check 6 (each half, every tick); "
        "*first*: the rule of capacity check 5 (every tick).",
        _report.table(header, rows_md),
        f"Wrong calls by {SHORT_S:g} s over all rates (a carried rate cut, or a rate not carried left uncut): "
        + ", ".join(f"{rule} rule {w} of {n * len(RATES)}" for rule, w in wrong.items()) + ". "
        f"Carried rates cut by {LONG_S:g} s (false fails, which change the search's answer): "
        + ", ".join(f"{rule} {c} of {carried_n}" for rule, c in false_cuts.items()) + ". "
        "Median time of the cut at the rates not carried (a later cut costs step time only): "
        + ", ".join(f"{rule} {t:.1f} s" for rule, t in late.items()) + ".",
        _report.contention(before, after),
    ])  # fmt: skip
    _report.write_section(NAME, markdown, {"stamp": run_stamp, "seeds": n, "rates": data}, MD_PATH, JSON_PATH)
    print(markdown)


if __name__ == "__main__":
    main()
