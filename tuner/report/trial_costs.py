"""What each trial cost: its boot, its measuring, the tuner's own time around them, and its peak memory.

A GPU study is paid by the hour and runs in leases, so a reader of its report asks where the time went
as well as what it bought. Each trial records the wall time of its phases (``phases_s``: the boot, the
warmup, the capacity search or the drive, the stress check) and Optuna its start and end; the tuner's
own time is the rest of the trial's wall time: sampling, the memory screen, writing the record,
stopping the engine and waiting until its memory is free. The peak is the engine's own processes'
GPU memory where the sampler could tell them apart, else the device-wide peak
(``tuner.measure.trial``). A trial that never booted, or was cut before it stored its phases, shows
``-`` where a figure is unknown. A finalist's fresh-boot repeats are not trials and store no phases,
so the finalists' boots are not here.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import optuna

from tuner.report.describe import engine_of
from tuner.report.trials_table import acceptance_cell
from tuner.study.attrs import STRESS_CHECK_KIND, trial_attrs

Trial = optuna.trial.FrozenTrial
GIB = 1024**3
BOOT = "boot"


@dataclass(frozen=True)
class TrialCost:
    number: int
    engine: str
    status: str
    booted: bool
    acceptance: str
    boot_s: float | None
    measure_s: float | None  # every phase after the boot: warmup, capacity search or drive, stress check
    tuner_s: float | None  # the wall time no phase accounts for
    wall_s: float | None
    peak_gib: float | None


def trial_cost(trial: Trial) -> TrialCost:
    attrs = trial_attrs(trial)
    phases = {k: float(v) for k, v in (attrs.get("phases_s") or {}).items() if isinstance(v, int | float)}
    start, end = trial.datetime_start, trial.datetime_complete
    wall = (end - start).total_seconds() if start is not None and end is not None else None
    measured = [v for k, v in phases.items() if k != BOOT]
    engine_peak, device_peak = attrs.get("engine_gpu_peak_bytes"), attrs.get("peak_memory_bytes")
    peak = engine_peak or device_peak or None
    return TrialCost(
        number=trial.number,
        engine=engine_of(trial),
        status=str(attrs.get("failure") or trial.state.name.lower()),
        booted=bool(attrs.get("booted")) or BOOT in phases,
        acceptance=acceptance_cell(dict(trial.user_attrs)),
        boot_s=phases.get(BOOT),
        measure_s=sum(measured) if measured else None,
        tuner_s=max(wall - sum(phases.values()), 0.0) if wall is not None and phases else None,
        wall_s=wall,
        peak_gib=peak / GIB if peak else None,
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


HEAD = ("trial", "engine", "status", "acceptance", "boot s", "measuring s", "tuner s", "wall s", "peak GiB")


def _cells(cost: TrialCost) -> tuple[str, ...]:
    peak = "-" if cost.peak_gib is None else f"{cost.peak_gib:.1f}"
    times = (cost.boot_s, cost.measure_s, cost.tuner_s, cost.wall_s)
    return (str(cost.number), cost.engine, cost.status, cost.acceptance, *map(_seconds, times), peak)


def _finished(study: optuna.Study) -> list[TrialCost]:
    """Every finished trial but the records of finalists' stress checks: those are never booted, and the
    check's time is in its finalist's repeats."""
    return [
        trial_cost(t)
        for t in study.get_trials(deepcopy=False)
        if t.state.is_finished() and trial_attrs(t).get("config_kind") != STRESS_CHECK_KIND
    ]


def total_line(costs: list[TrialCost]) -> str:
    """The study's time over its finished trials: boots, measuring, the tuner's own."""
    total = {name: sum(getattr(c, name) or 0.0 for c in costs) for name in ("boot_s", "measure_s", "tuner_s", "wall_s")}
    booted = sum(c.booted for c in costs)
    return (f"{len(costs)} finished trials, {booted} booted: {total['wall_s']:.0f} s in all, {total['boot_s']:.0f} s "
            f"booting, {total['measure_s']:.0f} s measuring, {total['tuner_s']:.0f} s the tuner's own.")  # fmt: skip


def costs_section(study: optuna.Study) -> str:
    costs = _finished(study)
    if not costs:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEAD)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in _cells(cost)) + "</tr>" for cost in costs)
    return (f'<section id="trial-costs"><h2>What each trial cost</h2><table><tr>{head}</tr>{rows}</table>'
            f"<p>{html.escape(total_line(costs))}</p></section>")  # fmt: skip


def costs_md(study: optuna.Study) -> list[str]:
    """The same table as Markdown lines, for ``summary.md``."""
    costs = _finished(study)
    if not costs:
        return []
    lines = ["", "## What each trial cost", "", "| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(_cells(cost)) + " |" for cost in costs]
    return [*lines, "", total_line(costs)]
