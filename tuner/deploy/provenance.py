"""The comment header of every launch file: where it came from and what was measured.

Every value goes on one line (``_oneline``): a newline inside a ``#`` comment would end the comment
and let the rest of a user-given value run as shell or YAML.
"""

from __future__ import annotations

from typing import Any

from tuner.study.attrs import capacity_uncertainty
from tuner.study.figures import number
from tuner.study.verdict import TOO_FEW_RUNS, describe_verdict

__all__ = ["provenance"]


def _oneline(value: object) -> str:
    """A value fit for a ``#`` comment: a newline there would end the comment and run the rest."""
    return " ".join(str(value).split())


def provenance(m: dict[str, Any]) -> list[str]:
    """Comment lines saying where a launch file came from; every value on one line."""
    objectives = "  ".join(_measured(k, v, (m.get("ci") or {}).get(k)) for k, v in m["objectives"].items()
                           if isinstance(v, int | float))  # fmt: skip
    return [
        f"# Launch file exported by tuner {_oneline(m['tuner_version'])} at {_oneline(m['exported_at'])}",
        f"# study: {_oneline(m['study'])}  trial: {m['trial']} ({_oneline(m['config_kind'])})",
        f"# engine: {_oneline(m['engine'])} {_oneline(m['engine_version'])} ({_oneline(m['distribution'])})",
        f"# hardware: {_oneline(m['hardware']['name'])}",
        f"# model: {_oneline(m['model'])}",
        f"# workload: {_oneline(m['workload'])}  digest: {_oneline(m['workload_digest'])}",
        f"# measured: {objectives}",
        *_capacity_lines(m),
        *_cost_lines(m),
        *_repeat_lines(m),
    ]


def _capacity_lines(m: dict[str, Any]) -> list[str]:
    """Each tier's capacity with the SLO and attainment target it was measured against."""
    lines = []
    for tier, c in ((m.get("capacity") or {}).get("tiers") or {}).items():
        slo = ", ".join(f"{k} <= {v:g}" for k, v in (c.get("slo") or {}).items())
        target = c.get("attainment_target", c.get("target"))
        share = f"{target:.0%}" if isinstance(target, int | float) else "?"
        value = c.get("capacity_req_s")
        rate = f"{value:.3g} req/s" if isinstance(value, int | float) else "unknown"
        known = capacity_uncertainty(c)
        lines.append(f"# capacity ({_oneline(tier)} tier): {rate} with {share} of requests within {_oneline(slo)}"
                     + (f" ({_oneline(known)})" if known else ""))  # fmt: skip
    return lines


def _cost_lines(m: dict[str, Any]) -> list[str]:
    """Each tier's output tokens/s per GPU at its capacity, and its price when the study has one."""
    cost = m.get("cost") or {}
    price = cost.get("gpu_price_usd_per_hour")
    lines = []
    for tier, c in (cost.get("tiers") or {}).items():
        dollars = c.get("usd_per_million_output_tokens")
        priced = f", ${dollars:.3g} per million output tokens at ${price:g}/GPU-hour" if dollars is not None else ""
        lines.append(f"# cost ({_oneline(tier)} tier): {c['output_tok_s_per_gpu']:.4g} output tok/s per GPU{priced}")
    return lines


def _measured(key: str, value: float, ci: dict[str, Any] | None) -> str:
    within = f" [95% CI {number(ci['low'])}-{number(ci['high'])}]" if ci else ""
    return f"{key}={number(value)}{within}"


def _repeat_lines(m: dict[str, Any]) -> list[str]:
    """The finalist repeats' means and 95 % intervals, and the verdict on every metric it was reached
    on (a capacity-pareto study's, one per tier), when the study has them."""
    lines = []
    for metric, s in ((m.get("repeats") or {}).get("stats") or {}).items():
        within = TOO_FEW_RUNS if s.get("low") is None else f"95% CI [{number(s['low'])}, {number(s['high'])}]"
        lines.append(f"# repeats {metric}: mean {number(s['mean'])}, {within}, n={s['n']}")
    stress = m.get("stress")
    if stress and stress.get("ran"):
        ttft = stress.get("ttft_p95_ms")
        seen = f"TTFT p95 {number(ttft)} ms" if isinstance(ttft, int | float) else "no request served"
        lines.append(f"# stress check: {stress['prompt_tokens']} prompt tokens x concurrency {stress['concurrency']}, "
                     f"cold cache: {seen}, {_oneline(stress.get('failure') or 'passed')}")  # fmt: skip
    verdict = m.get("verdict")
    if verdict:
        lines.append(f"# {_oneline(describe_verdict(verdict))}")
    return lines
