"""What an engine's own log says about memory, and the observations that calibrate the screen.

Lines read (vLLM 0.26-0.33, CPU and GPU builds; SGLang 0.5.17 and 0.5.23; see tests/data/captures):

* vLLM: "CPU|GPU KV cache size: N tokens", "Available KV cache memory: X GiB", "Model loading took
  W GiB", and on failure "the estimated maximum model length is L" (the tokens that would have fit);
  "Free memory on device ... is less than desired" marks a GPU shared with another process, which
  says nothing about the config itself.
* SGLang: "KV Cache is allocated. ... #tokens: N, K size: X GB, V size: Y GB", "Load weight end. ...
  mem usage=W GB", and on failure "Raise --mem-fraction-static above F".
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GIB = 2**30
_NUMBER = r"(-?[\d,]+(?:\.\d+)?)"
_FACTS = (
    ("kv_tokens", rf"(?:CPU|GPU) KV cache size: {_NUMBER} tokens", 1.0),
    ("kv_tokens", rf"KV Cache is allocated\..*#tokens: {_NUMBER}", 1.0),
    ("available_kv_bytes", rf"Available KV cache memory: {_NUMBER} GiB", GIB),
    ("weights_bytes", rf"Model loading took {_NUMBER} GiB", GIB),
    ("weights_bytes", rf"Load weight end\..*mem usage={_NUMBER} GB", GIB),
    ("max_len_fit", rf"estimated maximum model length is {_NUMBER}", 1.0),
    ("min_fraction", rf"Raise --mem-fraction-static above {_NUMBER}", 1.0),
    # vLLM's own view of the device (torch's total, a little below NVML's) and its memory budget
    ("device_total_bytes", rf"Free memory on device \({_NUMBER}/{_NUMBER} GiB\)", GIB),
    ("budget_bytes", rf"Desired GPU memory utilization is \({_NUMBER}, {_NUMBER} GiB\)", GIB),
)
_SGLANG_KV = re.compile(rf"K size: {_NUMBER} GB, V size: {_NUMBER} GB")
_SHARED_GPU = re.compile(r"Free memory on device .* is less than desired")
SERVED_FAILURES = frozenset({"crash_on_request", "oom_load", "request_errors", "slo_collapse"})
MEMORY_FAILURES = frozenset({"kv_insufficient", "oom_boot"})


def parse_facts(log_text: str) -> dict[str, float]:
    """The memory facts a boot log holds (the last of each kind wins: a retry may precede it)."""
    facts: dict[str, float] = {}
    for name, pattern, unit in _FACTS:
        for match in re.finditer(pattern, log_text):
            facts[name] = float(match.groups()[-1].replace(",", "")) * unit  # the last number is the one
    sglang = list(_SGLANG_KV.finditer(log_text))
    if sglang:
        k, v = (float(x) for x in sglang[-1].groups())
        facts["available_kv_bytes"] = (k + v) * GIB
    if _SHARED_GPU.search(log_text):
        facts["shared_gpu"] = 1.0
    return facts


@dataclass(frozen=True)
class Observation:
    """One trial, as the screen learns from it. ``booted`` is None where the trial says nothing
    about memory (screened, or failed for another reason)."""

    key: str
    engine: str
    fraction: float
    booted: bool | None
    kv_tokens: float | None  # tokens of KV cache it had, or (failed) the most that would have fit
    available_kv_bytes: float | None
    overhead_bytes: float | None  # GPU: the engine's budget - KV bytes - weights
    device_total_bytes: float | None = None  # the engine's own view of the device's memory


def observation(attrs: Mapping[str, Any]) -> Observation | None:
    est, facts, failure = attrs.get("memory_estimate"), attrs.get("memory_facts") or {}, attrs.get("failure")
    if not est:
        return None
    booted: bool | None = None
    if failure is None or failure in SERVED_FAILURES:
        booted = True
    elif failure in MEMORY_FAILURES and not facts.get("shared_gpu"):
        booted = False
    cpu = est.get("device_kind") == "cpu"
    available = est["available_kv_bytes"] if cpu else facts.get("available_kv_bytes")
    tokens = facts.get("kv_tokens") if booted else facts.get("max_len_fit")
    overhead = None
    if not cpu and available is not None and facts.get("weights_bytes") is not None:
        budget = facts.get("budget_bytes") or est["fraction"] * est["device_bytes"]
        overhead = budget - available - facts["weights_bytes"]
    engine = est["key"].split("|")[0]
    total = facts.get("device_total_bytes")
    return Observation(est["key"], engine, est["fraction"], booted, tokens, available, overhead, total)


def observations(trials_attrs: Sequence[Mapping[str, Any]]) -> list[Observation]:
    found = (observation(a) for a in trials_attrs)
    return [o for o in found if o is not None]


def predict_tokens(mine: Sequence[Observation], available: float, per_token: float) -> float:
    """KV tokens at ``available`` bytes: a line through the observed points (an engine keeps a
    fixed part of its budget for itself), through one point, or first principles without any."""
    points = sorted({(o.available_kv_bytes, o.kv_tokens) for o in mine if o.available_kv_bytes and o.kv_tokens})
    if len({x for x, _ in points}) >= 2:
        xs, ys = [x for x, _ in points], [y for _, y in points]
        slope = statistics.covariance(xs, ys) / statistics.variance(xs)
        return statistics.fmean(ys) + slope * (available - statistics.fmean(xs))
    if points:
        x, y = points[0]
        return available * y / x
    return available / per_token


def engine_device_bytes(seen: Sequence[Observation]) -> float | None:
    """The device memory as the engine itself counts it, where its log said."""
    totals = [o.device_total_bytes for o in seen if o.device_total_bytes]
    return statistics.median(totals) if totals else None


def calibrated_overhead(mine: Sequence[Observation]) -> float | None:
    """The smallest overhead seen: the estimate that screens the fewest configs that would run."""
    seen = [o.overhead_bytes for o in mine if o.overhead_bytes is not None]
    return min(seen) if seen else None
