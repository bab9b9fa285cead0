"""What a config's capacity is worth: output tokens per second per GPU at the SLO, and its price.

A config that carries more traffic under the SLO needs fewer GPUs, so the figure an operator decides
with is the output token rate one GPU sustains *at its capacity*, and, given an hourly price per GPU
(``--gpu-price``), the dollars one million output tokens cost at that rate:
``price / 3600 / (tokens/s per GPU) * 1e6``. That rate is the claimed request rate times the output
tokens per answered request of the step the capacity was decided at: a config carrying its capacity
answers every request sent, so in steady state it emits what arrives. The step's own token rate is not
used: a step a look passed early ends with its longest requests still in flight, and its window then
counts only part of the tokens the rate produces (study 1's block 1 on the H200:
reports/gpu-h200/study-1/block1/NOTES.md). Both are read from a
trial's stored capacity record, so a price given later (``tuner trials --gpu-price``) prices an
older study too. A finalist's fresh-boot repeats give another capacity, their mean: it is priced at
the trial's output tokens per request (a property of the workload's answers, not of the boot).
A trial's GPUs are those its launch was given (``CUDA_VISIBLE_DEVICES``), else one: the CPU build's
device counts as one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from tuner.study.attrs import step_at_capacity

PRICE_ATTR = "gpu_price_usd_per_hour"  # the study attribute ``tuner search --gpu-price`` sets


def gpus_of(attrs: Mapping[str, Any]) -> int:
    """How many GPUs a trial's server was given (at least one)."""
    env = ((attrs.get("launch") or {}).get("env") or {}) if isinstance(attrs.get("launch"), dict) else {}
    visible = env.get("CUDA_VISIBLE_DEVICES") if isinstance(env, dict) else None
    return max(1, len([g for g in str(visible).split(",") if g.strip()])) if visible else 1


def _positive(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) and value > 0 else None


def tier_output_tok_s(attrs: Mapping[str, Any], tier: str, capacity_req_s: float | None = None) -> float | None:
    """Output tokens/s at a tier's capacity (the trial's own, or ``capacity_req_s``: its repeats'
    mean): the capacity times the output tokens per answered request of the step the trial's capacity
    was decided at (None: no capacity, or an older study without the step's rates)."""
    capacity = attrs.get("capacity")
    record = (capacity.get("tiers") or {}).get(tier) if isinstance(capacity, dict) else None
    own = _positive(record.get("capacity_req_s")) if isinstance(record, dict) else None
    at = step_at_capacity(record) if isinstance(record, dict) and own is not None else None
    rate = _positive(capacity_req_s) if capacity_req_s is not None else own
    if rate is None or at is None:
        return None
    tok_s, req_s = _positive(at.get("output_throughput_tok_s")), _positive(at.get("request_throughput_req_s"))
    return rate * tok_s / req_s if tok_s is not None and req_s is not None else None


def tok_s_per_gpu(attrs: Mapping[str, Any], tier: str, capacity_req_s: float | None = None) -> float | None:
    """Output tokens/s per GPU at the tier's capacity (``tier_output_tok_s``)."""
    rate = tier_output_tok_s(attrs, tier, capacity_req_s)
    return None if rate is None else rate / gpus_of(attrs)


def usd_per_million_tokens(per_gpu_tok_s: float | None, price_usd_per_gpu_hour: float | None) -> float | None:
    """Dollars per million output tokens at ``per_gpu_tok_s`` on a GPU priced per hour (None: unknown)."""
    if per_gpu_tok_s is None or price_usd_per_gpu_hour is None or per_gpu_tok_s <= 0:
        return None
    return price_usd_per_gpu_hour / 3600.0 / per_gpu_tok_s * 1e6


def cost_text(attrs: Mapping[str, Any], tier: str, price: float | None, capacity_req_s: float | None = None) -> str:
    """``1234 tok/s per GPU, $0.56 per million output tokens at $2.50/GPU-hour``, or '' when unknown;
    at ``capacity_req_s`` (a finalist's repeats' mean) where given, else at the trial's own capacity."""
    per_gpu = tok_s_per_gpu(attrs, tier, capacity_req_s)
    if per_gpu is None:
        return ""
    dollars = usd_per_million_tokens(per_gpu, price)
    priced = f", ${dollars:.3g} per million output tokens at ${price:g}/GPU-hour" if dollars is not None else ""
    return f"{per_gpu:.4g} tok/s per GPU{priced}"
