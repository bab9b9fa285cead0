"""The pre-boot memory screen: predict whether a config's KV cache fits, and learn from every boot.

A model from first principles, calibrated on the hardware at hand:

* KV bytes per token = 2 (K and V) x layers x KV heads x head size x dtype bytes, summed over the
  target and what its speculative method adds (read from their ``config.json``); weights = the
  safetensors files' sizes (or the parameter count from the config, for ``--load-format dummy``).
  Each method's cost (``tuner.engines.speculation``): a draft model's weights and KV, a head's
  weights and the KV of its own layer (EAGLE's and EAGLE-3's one), MTP the KV of the MTP layers the
  target ships (their weights are in the target's files already), n-gram and suffix nothing.
* KV bytes available at memory fraction f: on vLLM's CPU build exactly f x the KV budget (the
  ``--kv-cache-memory-bytes`` the trial passes); on a GPU f x device memory - weights - the
  engine's runtime overhead (activations, non-torch memory).
* A config needs the KV cache of one request at the max model length (vLLM refuses to start
  without it; SGLang starts with any positive pool).

Calibration (``tuner.search.memory`` reads the engine's own log lines): a trial that booted reports
its KV cache in tokens, and a GPU trial the bytes it had for it, which gives the real bytes per
token and the real overhead; a trial that failed ``kv_insufficient`` says which fraction was too
small. Trials of the same engine, target, draft and max model length then decide by observation:
a fraction at or below one that failed fails, one at or above one that booted boots, and between,
the calibrated model decides. Uncalibrated, the screen only rejects a config whose first-principles
KV cache falls short by more than half, so it rarely stops a config that would have run.

What an engine's own log says about memory, and the observations that calibrate the screen.

Lines read (vLLM 0.26 and 0.32, CPU and GPU builds; SGLang 0.5.17 and 0.5.23; see tests/data/captures):

* vLLM: "CPU|GPU KV cache size: N tokens", "Available KV cache memory: X GiB", "Model loading took
  W GiB", and on failure "the estimated maximum model length is L" (the tokens that would have fit);
  "Free memory on device ... is less than desired" marks a GPU shared with another process, which
  says nothing about the config itself.
* SGLang: "KV Cache is allocated. ... #tokens: N, K size: X GB, V size: Y GB", "Load weight end. ...
  mem usage=W GB", and on failure "Raise --mem-fraction-static above F".
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from tuner.engines.base import Config, Device, ModelSpec
from tuner.engines.speculation import WITH_TARGET_LAYERS, draft_of, method_of

UNCALIBRATED_MARGIN = 0.5  # screen only when the estimate is below half of what is needed
CALIBRATED_MARGIN = 0.05  # block rounding: the engines allocate whole blocks of 16 tokens
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class Shape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    weights_bytes: int

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def _param_count(c: dict[str, Any]) -> int:
    hidden, layers, heads = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["num_attention_heads"])
    inter = int(c.get("intermediate_size", 4 * hidden))
    kv = int(c.get("num_key_value_heads", heads)) * int(c.get("head_dim", hidden // heads))
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter
    embeddings = int(c["vocab_size"]) * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return layers * per_layer + embeddings


def read_shape(model_dir: str, dummy: bool = False) -> Shape | None:
    """The shape of a model folder, or None when its ``config.json`` cannot be read (no screen)."""
    try:
        c = json.loads((Path(model_dir) / "config.json").read_text())
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
        dtype = DTYPE_BYTES.get(str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"), 2)
        files = [] if dummy else list(Path(model_dir).glob("*.safetensors"))
        weights = sum(f.stat().st_size for f in files) or _param_count(c) * dtype
        return Shape(int(c["num_hidden_layers"]), int(c.get("num_key_value_heads", heads)), head_dim, dtype, weights)
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


@dataclass(frozen=True)
class Estimate:
    """What the screen thought of one config; stored on the trial as ``memory_estimate``."""

    key: str  # engine | device kind | draft | max model length: trials that calibrate each other
    device_kind: str
    device_bytes: int
    fraction: float
    required_tokens: int
    predicted_tokens: int
    kv_bytes_per_token: float
    available_kv_bytes: float
    weights_bytes: int
    overhead_bytes: float
    basis: str  # "first principles", "calibrated on N trials", or the observation that decided
    fits: bool

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _costly(config: Config) -> str | None:
    """What of a config's speculation takes memory: its draft or head, or a method that reads the
    target's own extra layers (None: nothing, as n-gram and suffix, or speculation off)."""
    method = method_of(config.params)
    return draft_of(config.params) or (method if method in WITH_TARGET_LAYERS else None)


def screen_key(config: Config, device: Device, model: ModelSpec) -> str:
    """Trials that calibrate each other: same engine, device kind, draft (or head) and max model length.
    Speculation that costs no memory shares the key of none."""
    return f"{config.engine}|{device.kind}|{_costly(config) or '-'}|{model.max_model_len}"


def _without_draft(key: str) -> str:
    engine, kind, _, length = key.split("|")
    return f"{engine}|{kind}|-|{length}"


def _fraction(config: Config, default_fraction: float | None) -> float | None:
    given = config.params.get("memory_fraction")
    return float(given) if given is not None else default_fraction


def _shapes(config: Config, model: ModelSpec) -> list[Shape] | None:
    """The target's shape, and what its speculation adds: the draft's or head's own, or the target's
    MTP layers (KV only: their weights are the target's)."""
    dummy = model.load_format == "dummy"
    target = read_shape(model.path, dummy)
    shapes = [target]
    draft = draft_of(config.params)
    if draft is not None:
        shapes.append(read_shape(model.draft_path(draft), dummy))
    elif target is not None and method_of(config.params) in WITH_TARGET_LAYERS:
        shapes.append(replace(target, layers=model.mtp_layers, weights_bytes=0))
    return None if any(s is None for s in shapes) else [s for s in shapes if s is not None]


def estimate(
    config: Config,
    model: ModelSpec,
    device: Device,
    history: Sequence[Observation],
    default_fraction: float | None,
    required_tokens: int,
    free_bytes: int | None = None,
) -> Estimate | None:
    """The screen's estimate for ``config`` (None: nothing to go on, so never screened)."""
    fraction, shapes = _fraction(config, default_fraction), _shapes(config, model)
    if fraction is None or shapes is None:
        return None
    key = screen_key(config, device, model)
    mine = [o for o in history if o.key == key]
    per_token = float(sum(s.kv_bytes_per_token for s in shapes))
    weights = sum(s.weights_bytes for s in shapes)
    overhead = 0.0
    if device.kind == "cpu":  # the KV cache is exactly the share of the budget the trial passes
        available = fraction * device.memory_bytes
    else:
        same_engine = [o for o in history if o.engine == config.engine]
        overhead = calibrated_overhead(mine) or calibrated_overhead(same_engine) or 0.0
        total = engine_device_bytes(same_engine) or device.memory_bytes
        available = fraction * total - weights - overhead
    predicted = max(int(predict_tokens(mine, available, per_token)), 0)
    # speculation only adds memory: where the target alone ran out, it does with a draft or head too
    plain = (
        [o for o in history if o.key == _without_draft(key) and o.booted is False] if key != _without_draft(key) else []
    )
    basis, fits = decide(mine + plain, fraction, predicted, required_tokens)
    if free_bytes is not None and device.kind != "cpu" and free_bytes < fraction * device.memory_bytes:
        # vLLM's rule at startup: the free memory must cover the fraction's share of the device
        basis, fits = f"free memory {free_bytes / 2**30:.1f} GiB is below the fraction's share", False
    return Estimate(
        key, device.kind, device.memory_bytes, fraction, required_tokens, predicted, per_token, available,
        weights, overhead, basis, fits,
    )  # fmt: skip


def decide(mine: Sequence[Observation], fraction: float, predicted: int, required: int) -> tuple[str, bool]:
    """Observations first (a smaller fraction fails too, a larger one boots too), then the model."""
    failed = [o.fraction for o in mine if o.booted is False and o.fraction >= fraction]
    if failed:
        return f"a trial at memory fraction {min(failed):g} ran out of memory", False
    booted = [o.fraction for o in mine if o.booted and o.fraction <= fraction]
    if booted:
        return f"a trial at memory fraction {max(booted):g} booted", True
    n = sum(1 for o in mine if o.kv_tokens and o.available_kv_bytes)
    margin = CALIBRATED_MARGIN if n else UNCALIBRATED_MARGIN
    basis = f"calibrated on {n} trials" if n else "first principles"
    return basis, predicted >= required * (1.0 - margin)


# What an engine's boot log says of its memory: KV cache size, weights, the context that would fit.
GIB = 2**30
_NUMBER = r"(-?[\d,]+(?:\.\d+)?)"
_FACTS = (
    ("kv_tokens", rf"(?:CPU|GPU) KV cache size: {_NUMBER} tokens", 1.0),
    ("kv_tokens", rf"KV Cache is allocated\..*#tokens: {_NUMBER}", 1.0),
    ("available_kv_bytes", rf"Available KV cache memory: {_NUMBER} GiB", GIB),
    ("weights_bytes", rf"Model loading took {_NUMBER} GiB", GIB),
    ("max_len_fit", rf"estimated maximum model length is {_NUMBER}", 1.0),
    ("min_fraction", rf"Raise --mem-fraction-static above {_NUMBER}", 1.0),
    # vLLM's own view of the device (torch's total, a little below NVML's) and its memory budget
    ("device_total_bytes", rf"Free memory on device \({_NUMBER}/{_NUMBER} GiB\)", GIB),
    ("budget_bytes", rf"Desired GPU memory utilization is \({_NUMBER}, {_NUMBER} GiB\)", GIB),
)
_SGLANG_KV = re.compile(rf"K size: {_NUMBER} GB, V size: {_NUMBER} GB")
_SGLANG_WEIGHTS = re.compile(rf"Load weight end\..*mem usage={_NUMBER} GB")
_SHARED_GPU = re.compile(r"Free memory on device .* is less than desired")
SERVED_FAILURES = frozenset({"crash_on_request", "oom_load", "request_errors", "slo_collapse"})
MEMORY_FAILURES = frozenset({"kv_insufficient", "oom_boot"})


def parse_facts(log_text: str) -> dict[str, float]:
    """The memory facts a boot log holds (the last of each kind wins: a retry may precede it).

    SGLang with a draft model loads the draft after the target and logs its weights and KV cache in
    the same words, so there the target's are the largest (a draft is smaller than its target, and a
    retried boot repeats the same figures), never the last.
    """
    facts: dict[str, float] = {}
    for name, pattern, unit in _FACTS:
        for match in re.finditer(pattern, log_text):
            facts[name] = float(match.groups()[-1].replace(",", "")) * unit  # the last number is the one
    weights = [float(m.group(1)) for m in _SGLANG_WEIGHTS.finditer(log_text)]
    if weights:
        facts["weights_bytes"] = max(weights) * GIB
    kv = [float(k) + float(v) for k, v in (m.groups() for m in _SGLANG_KV.finditer(log_text))]
    if kv:
        facts["available_kv_bytes"] = max(kv) * GIB
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
