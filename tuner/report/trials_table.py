"""The trials table printed by ``tuner trials`` and at the end of ``tuner search``.

In a capacity study the table shows each trial's capacity per SLO tier (req/s) instead of its TTFT and
throughput, and each tier's SLO under it; under ``--sampler model`` also what the model predicted for
the objective tier before the trial booted. Where some trial speculated, an ``accept`` column gives each
speculating trial's acceptance rate and mean accepted length (``speculation`` attribute): at the
objective tier's capacity in a capacity study.
"""

from __future__ import annotations

from typing import Any

import optuna

from tuner.report.capacity import (
    capacity_cell,
    has_predictions,
    is_capacity_study,
    predicted_cell,
    slo_text,
    tier_disagreements,
    tiers,
)
from tuner.report.describe import engine_of, mean_interval, params_text
from tuner.report.overrides import overrides_lines
from tuner.study.attrs import SCREENED, is_default, study_attrs_of
from tuner.study.cost import PRICE_ATTR, tok_s_per_gpu, usd_per_million_tokens
from tuner.study.feasible import feasible_pareto
from tuner.study.verdict import MIN_RUNS, describe_verdict, repeat_interval, reread, verdicts_by_metric

COLUMNS = ("#", "state", "failure", "ttft_p95_ms", "tok/s", "repeats: tok/s mean [95% CI]", "params")


def _params(trial: optuna.trial.FrozenTrial) -> str:
    return f"{engine_of(trial)} (engine defaults)" if is_default(trial) else params_text(trial)


def _number(value: object, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, int | float) else "-"


def repeats_cell(finalist: dict[str, Any] | None, metric: str, runs: list[dict[str, Any]], withdrawn: int) -> str:
    """The finalist's summary once the stage has ended; while it runs (it may span GPU leases), the
    repeats stored so far, with their mean [95 % interval] once they are enough for one (a finalist
    done while the others run); and how many were withdrawn (``withdraw_repeat``)."""
    if finalist is not None:
        stats = (finalist.get("stats") or {}).get(metric)
        counts = _counts(failed=len(finalist.get("failures") or []), withdrawn=withdrawn)
        return ("all failed" if stats is None else f"{mean_interval(stats)} n={stats['n']}") + counts
    if not runs:
        return "-" + _counts(withdrawn=withdrawn)
    served = [r["metrics"][metric] for r in runs if r.get("failure") is None and metric in (r.get("metrics") or {})]
    figures = ", ".join(format(v, ".3g") for v in served) or "none served"
    stats = repeat_interval(runs, metric) if len(served) >= MIN_RUNS else None
    summary = f": {mean_interval(stats)}" if stats is not None else ""
    return f"so far {figures}{summary}" + _counts(runs=len(runs), failed=len(runs) - len(served), withdrawn=withdrawn)


def reread_lines(study: optuna.Study) -> list[str]:
    """Where the finalists' stored intervals are not what this version makes of their stored repeats
    (``tuner.study.verdict.reread``: they ran at an older tag), a heading, each finalist's intervals
    read again, and the verdict on them; else nothing. The stored verdict stays what the study says."""
    again = reread(study_attrs_of(study))
    if again is None:
        return []
    lines = ["Read again from the stored repeats with this version's intervals (a capacity's reaches up "
             "by its repeats' brackets: docs/search.md):"]  # fmt: skip
    judged = verdicts_by_metric(again["verdict"])  # the metrics the verdict reads, not every one kept
    for f in again["finalists"]:
        stats = f.get("stats") or {}
        shown = ", ".join(f"{m} {mean_interval(stats[m])}" for m in judged if m in stats)
        lines.append(f"trial {f['trial']}: {shown or 'none served'}")
    return lines + [f"{m}: {describe_verdict(v)}" for m, v in judged.items()]


def _counts(runs: int = 0, failed: int = 0, withdrawn: int = 0) -> str:
    said = [f"{runs} run{'' if runs == 1 else 's'}"] if runs else []
    said += [f"{n} {what}" for n, what in ((failed, "failed"), (withdrawn, "withdrawn")) if n]
    return f" ({', '.join(said)})" if said else ""


def _status(attrs: dict[str, Any]) -> str:
    if attrs.get("idle_draft_like") is not None:  # told pruned without a boot (tuner.search.acceptance)
        return f"idle draft, as trial {attrs['idle_draft_like']}"
    pruned = attrs.get("pruned")
    if isinstance(pruned, dict) and isinstance(pruned.get("steps"), int):
        return f"pruned after {pruned['steps']} steps"  # a capacity search that fell short of the incumbent
    if isinstance(pruned, dict) and "at_requests" in pruned:
        return f"pruned at {pruned['at_requests']}/{pruned.get('of', '?')}"
    return "pruned" if pruned else str(attrs.get("failure") or "-")


def speculated(study: optuna.Study) -> bool:
    return any(t.user_attrs.get("speculation") for t in study.get_trials(deepcopy=False))


def acceptance_cell(attrs: dict[str, Any]) -> str:
    """``42% x2.26``: the acceptance rate and mean accepted length; ``-`` where there is none."""
    spec = attrs.get("speculation") or {}
    rate, length = spec.get("acceptance_rate"), spec.get("mean_accept_len")
    if not isinstance(rate, int | float):
        return "-"
    return f"{rate:.0%}" + (f" x{length:.2f}" if isinstance(length, int | float) else "")


def header(study: optuna.Study, price: float | None = None) -> tuple[str, ...]:
    accept = ("accept",) if speculated(study) else ()
    if not is_capacity_study(study):
        return (*COLUMNS[:-2], *accept, *COLUMNS[-2:])
    capacities = tuple(f"{t.name} req/s" for t in tiers(study))
    cost = ("tok/s/GPU", "$/M tok") if price is not None else ("tok/s/GPU",)
    said = tuple(f"predicted {t.name}" for t in tiers(study)[:1]) if has_predictions(study) else ()
    return ("#", "state", "failure", *capacities, *said, *cost, *accept, "repeats: req/s mean [95% CI]", "params")


def _cost_cells(attrs: dict[str, Any], tier: str, price: float | None) -> tuple[str, ...]:
    """Output tokens/s per GPU at the objective tier's capacity and, with a price, $ per million of them."""
    per_gpu = tok_s_per_gpu(attrs, tier)
    cells = (_number(per_gpu, ".4g"),)
    return cells + (_number(usd_per_million_tokens(per_gpu, price), ".3g"),) if price is not None else cells


def study_price(study: optuna.Study, given: float | None = None) -> float | None:
    """The GPU price to show: the one given now, else the one the study was searched with."""
    stored = study.user_attrs.get(PRICE_ATTR)
    return given if given is not None else float(stored) if isinstance(stored, int | float) else None


def trial_rows(study: optuna.Study, price: float | None = None) -> list[tuple[str, ...]]:
    front = {t.number for t in feasible_pareto(study)}
    attrs_of_study = study_attrs_of(study)
    finalists = {f.get("trial"): f for f in attrs_of_study.get("finalists", []) if isinstance(f, dict)}
    runs, withdrawn = attrs_of_study.get("finalist_runs") or {}, attrs_of_study.get("finalist_runs_withdrawn") or {}
    capacity = is_capacity_study(study)
    names = [t.name for t in tiers(study)] if capacity else []
    said = names[:1] if capacity and has_predictions(study) else []  # the objective tier's, before the boot
    metric = "capacity_req_s" if capacity else "output_throughput_tok_s"
    accept = speculated(study)
    rows: list[tuple[str, ...]] = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        if capacity:
            measured = (
                *(capacity_cell(t, n) for n in names),
                *(predicted_cell(t, n) for n in said),
                *_cost_cells(attrs, names[0], price),
            )
        else:
            throughput = None if attrs.get("pruned") else attrs.get("output_throughput_tok_s")
            measured = (_number(attrs.get("ttft_p95_ms"), ".0f"), _number(throughput, ".1f"))
        mark = "*" if t.number in front else ""
        if accept:
            measured = (*measured, acceptance_cell(attrs))
        rows.append((f"{t.number}{mark}", t.state.name, _status(attrs), *measured,
                     repeats_cell(finalists.get(t.number), metric, runs.get(str(t.number)) or [],
                              len(withdrawn.get(str(t.number)) or [])), _params(t)))  # fmt: skip
    return rows


def format_table(rows: list[tuple[str, ...]], columns: tuple[str, ...] = COLUMNS) -> str:
    table = [columns, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(columns) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=True)) + "  " + r[-1] for r in table]
    return "\n".join(line.rstrip() for line in lines)


def search_effort(study: optuna.Study) -> str:
    """What the screen and the pruner spared: one line under the table."""
    attrs = [t.user_attrs for t in study.get_trials(deepcopy=False)]
    # a twin says booted=False (and carries no times); trials recorded before that flag had boot_s alone
    booted = sum(1 for a in attrs if a.get("booted", a.get("boot_s") is not None))
    screened = sum(1 for a in attrs if a.get("failure") == SCREENED)
    twins = sum(1 for a in attrs if a.get("duplicate_of") is not None)
    idle = sum(1 for a in attrs if a.get("idle_draft_like") is not None)
    pruned = [a["pruned"] for a in attrs if a.get("pruned")]
    # the load pruner knows what it spared; a capacity search cut at its rescue probe (PRUNE_SHARE x
    # the incumbent) does not
    cut_load = [p["saved_s"] for p in pruned if isinstance(p, dict) and p.get("saved_s") is not None]
    how = [f"{len(cut_load)} mid-workload (about {sum(cut_load):.0f} s of workload not driven)"] if cut_load else []
    if cut_capacity := len(pruned) - len(cut_load):
        how.append(f"{cut_capacity} failing the SLO below the incumbent's capacity")
    return (f"{len(attrs)} trials: {booted} booted an engine, {screened} screened by the memory screen (never "
            f"booted), {twins} told from an earlier trial of the same config (never booted), {len(pruned)} "
            f"pruned" + (f": {', '.join(how)}" if how else "")
            + (f"; {idle} whose draft an earlier trial measured accepting next to nothing (never booted)"
               if idle else ""))  # fmt: skip


def trials_table(study: optuna.Study, gpu_price: float | None = None) -> str:
    """The table; ``gpu_price`` (USD per GPU-hour) overrides the study's own for the cost column."""
    legend = "* feasible Pareto-optimal"
    attrs = study_attrs_of(study)
    price = study_price(study, gpu_price)
    lines = [format_table(trial_rows(study, price), header(study, price)), legend]
    if is_capacity_study(study):
        lines += [f"SLO {tier.name}: {slo_text(tier)}" for tier in tiers(study)]
        lines += [f"tiers disagree, {line}" for line in tier_disagreements(study)]
        first = tiers(study)[0].name if tiers(study) else "?"
        priced = f" at ${price:g}/GPU-hour" if price is not None else " (--gpu-price to price them)"
        lines.append(f"tok/s/GPU: output tokens per second per GPU at the {first} tier's capacity{priced}")
    lines.append(search_effort(study))
    lines += overrides_lines(study)
    withdrawn = attrs.get("finalist_runs_withdrawn") or {}
    lines += [f"trial {n}: repeat {r.get('repeat')} withdrawn ({r.get('withdrawn')})"
              for n, runs in withdrawn.items() for r in runs]  # fmt: skip
    if (verdict := attrs.get("verdict")) is not None:
        lines.append(describe_verdict(verdict))
        lines += reread_lines(study)
    return "\n".join(lines)
