"""What the engines changed of the configs they were given, as their boots logged it.

An engine may run a config otherwise than it was asked: SGLang caps the running requests with
speculation unless told a cap, vLLM 0.26 turns async scheduling off with a draft model and keeps only
piecewise CUDA graphs with a K-by-batch-size schedule. Such a change can decide what a trial measured
(the H200 study's blocks 3 and 6), so the report lists each change once, with the engine and the
trials whose boots logged it (``engine_overrides``, read by the engine's adapter,
``EngineAdapter.overrides_in``). Trials recorded before the tuner read them show nothing.
"""

from __future__ import annotations

import html

import optuna

from tuner.report.describe import engine_of
from tuner.study.attrs import trial_attrs

TITLE = "What the engines changed of the configs"


def override_rows(study: optuna.Study) -> list[tuple[str, str, list[int]]]:
    """(engine, what it changed, the trials whose boots logged it), in the order first logged."""
    found: dict[tuple[str, str], list[int]] = {}
    for trial in study.get_trials(deepcopy=False):
        for change in trial_attrs(trial).get("engine_overrides") or []:
            found.setdefault((engine_of(trial), str(change)), []).append(trial.number)
    return [(engine, change, numbers) for (engine, change), numbers in found.items()]


def overrides_lines(study: optuna.Study) -> list[str]:
    """One line per change, for ``tuner trials``."""
    return [f"{engine} changed the config: {change} (trials {_numbers(numbers)})"
            for engine, change, numbers in override_rows(study)]  # fmt: skip


def overrides_md(study: optuna.Study) -> list[str]:
    rows = override_rows(study)
    if not rows:
        return []
    table = [f"| {engine} | {change} | {_numbers(numbers)} |" for engine, change, numbers in rows]
    return ["", f"## {TITLE}", "", "| engine | what it changed | trials |", "|---|---|---|", *table]


def overrides_section(study: optuna.Study) -> str:
    rows = override_rows(study)
    body = "".join(
        f"<tr><td>{html.escape(engine)}</td><td>{html.escape(change)}</td><td>{_numbers(numbers)}</td></tr>"
        for engine, change, numbers in rows
    )
    table = f"<table><tr><th>engine</th><th>what it changed</th><th>trials</th></tr>{body}</table>" if rows else ""
    return f'<section id="overrides"><h2>{TITLE}</h2>{table or "<p>none logged</p>"}</section>'


def _numbers(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))
