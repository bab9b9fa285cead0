"""The trials table printed by ``tuner trials`` and at the end of ``tuner search``."""

from __future__ import annotations

import optuna

from tuner.study import feasible_pareto

COLUMNS = ("#", "state", "failure", "ttft_p95_ms", "tok/s", "params")


def _params(trial: optuna.trial.FrozenTrial) -> str:
    if trial.user_attrs.get("config_kind") == "engine_default":
        return f"{trial.params.get('engine', '?')} (engine defaults)"
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())


def _number(value: object, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def trial_rows(study: optuna.Study) -> list[tuple[str, ...]]:
    front = {t.number for t in feasible_pareto(study)}
    rows: list[tuple[str, ...]] = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        mark = "*" if t.number in front else ""
        rows.append(
            (
                f"{t.number}{mark}",
                t.state.name,
                str(attrs.get("failure") or "-"),
                _number(attrs.get("ttft_p95_ms"), ".0f"),
                _number(attrs.get("output_throughput_tok_s"), ".1f"),
                _params(t),
            )
        )
    return rows


def format_table(rows: list[tuple[str, ...]]) -> str:
    table = [COLUMNS, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in table]
    return "\n".join(line.rstrip() for line in lines)


def trials_table(study: optuna.Study) -> str:
    legend = "* feasible Pareto-optimal (TTFT p95 against output throughput)"
    return format_table(trial_rows(study)) + "\n" + legend
