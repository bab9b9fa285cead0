"""The trials table printed by ``tuner trials`` and at the end of ``tuner search``."""

from __future__ import annotations

from typing import Any

import optuna

from tuner.study.feasible import feasible_pareto
from tuner.study.verdict import describe_verdict

COLUMNS = ("#", "state", "failure", "ttft_p95_ms", "tok/s", "repeats: tok/s mean [95% CI]", "params")


def _params(trial: optuna.trial.FrozenTrial) -> str:
    if trial.user_attrs.get("config_kind") == "engine_default":
        return f"{trial.params.get('engine', '?')} (engine defaults)"
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())


def _number(value: object, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def _repeats(finalist: dict[str, Any] | None) -> str:
    if finalist is None:
        return "-"
    stats = finalist["stats"].get("output_throughput_tok_s")
    failed = f" ({len(finalist['failures'])} failed)" if finalist["failures"] else ""
    if stats is None:
        return "all failed" + failed
    return f"{stats['mean']:.1f} [{stats['low']:.1f}, {stats['high']:.1f}] n={stats['n']}{failed}"


def trial_rows(study: optuna.Study) -> list[tuple[str, ...]]:
    front = {t.number for t in feasible_pareto(study)}
    finalists = {f["trial"]: f for f in study.user_attrs.get("finalists", [])}
    rows: list[tuple[str, ...]] = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        mark = "*" if t.number in front else ""
        pruned = attrs.get("pruned")
        status = f"pruned at {pruned['at_requests']}/{pruned['of']}" if pruned else str(attrs.get("failure") or "-")
        rows.append(
            (
                f"{t.number}{mark}",
                t.state.name,
                status,
                _number(attrs.get("ttft_p95_ms"), ".0f"),
                _number(None if pruned else attrs.get("output_throughput_tok_s"), ".1f"),
                _repeats(finalists.get(t.number)),
                _params(t),
            )
        )
    return rows


def format_table(rows: list[tuple[str, ...]]) -> str:
    table = [COLUMNS, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in table]
    return "\n".join(line.rstrip() for line in lines)


def search_effort(study: optuna.Study) -> str:
    """What the screen and the pruner spared: one line under the table."""
    attrs = [t.user_attrs for t in study.get_trials(deepcopy=False)]
    # a twin copies its trial's attributes (boot_s too) but says booted=False; older trials lack the flag
    booted = sum(1 for a in attrs if a.get("booted", a.get("boot_s") is not None))
    screened = sum(1 for a in attrs if a.get("failure") == "screened")
    twins = sum(1 for a in attrs if a.get("duplicate_of") is not None)
    pruned = [a["pruned"] for a in attrs if a.get("pruned")]
    saved = sum(p["saved_s"] for p in pruned)
    return (f"{len(attrs)} trials: {booted} booted an engine, {screened} screened by the memory screen (never "
            f"booted), {twins} told from an earlier trial of the same config (never booted), {len(pruned)} "
            f"pruned (about {saved:.0f} s of workload not driven)")  # fmt: skip


def trials_table(study: optuna.Study) -> str:
    legend = "* feasible Pareto-optimal"
    verdict = study.user_attrs.get("verdict")
    lines = [format_table(trial_rows(study)), legend, search_effort(study)]
    if verdict is not None:
        lines.append(describe_verdict(verdict))
    return "\n".join(lines)
