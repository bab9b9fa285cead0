"""Where the fit starts on a GPU it knows: what an iteration costs at the GPU's peak rates.

The fit (``tuner.search.model.fit``) is a fixed point over schedules, and where it starts decides
where it ends: on study 1's H200 steps, started from the request times alone it settled with no
attention cost at all and every step simulated too slow, while started from the costs below it
settled with every cost in a place the hardware explains and a smaller error (reports/search.md,
the model-study section; the iteration's parts timed on that GPU: reports/gpu-h200/iteration-costs-1/).

The start is the roofline of one iteration, each part at its bound:

* the iteration reads every weight once (memory bandwidth), whatever it computes;
* every token it computes costs two floating-point operations per parameter (compute);
* a decoding sequence reads its whole cached context once (memory bandwidth);
* a sequence of its own, and prefill attention, start at nothing: the model's facts here do not
  give the attention's width, and the fit finds both.

Each at ``EFFICIENCY`` of the peak, since no engine runs at its GPU's datasheet rates. A GPU not in
``PEAKS`` (and any CPU) gets no start from here: the fit starts from the request times alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tuner.engines.base import Device
from tuner.search.model.simulate import TARGET_FEATURES

# Datasheet peaks, dense bf16 tensor operations and memory bandwidth (NVIDIA's product pages), by a
# name nvidia-smi reports; the first entry whose words all appear in the device's name applies, so
# a variant comes before its family's plain name.
PEAKS: tuple[tuple[str, float, float], ...] = (
    # name words, bytes/s, FLOP/s
    ("H200 NVL", 4.8e12, 835e12),
    ("H200", 4.8e12, 989e12),
    ("H100 PCIe", 2.0e12, 756e12),
    ("H100 NVL", 3.9e12, 835e12),
    ("H100", 3.35e12, 989e12),
    ("A100 40GB", 1.555e12, 312e12),
    ("A100", 2.039e12, 312e12),
    ("L40S", 0.864e12, 362e12),
    ("L4", 0.3e12, 121e12),
    ("B200", 8.0e12, 2250e12),
)
EFFICIENCY = 0.5  # of each peak: a start for the fit to move from, not a claim
BYTES_PER_PARAMETER = 2  # bf16 or fp16 weights, as the engines serve the tuner's models
FLOPS_PER_PARAMETER = 2  # a multiply and an add per parameter and token


@dataclass(frozen=True)
class ModelFacts:
    """What the memory screen knows of the served model (``tuner.search.memory.Estimate``): its weights
    and what one token of context holds in the KV cache, in bytes."""

    weights_bytes: float
    kv_bytes_per_token: float


def peaks_of(device: Device) -> tuple[float, float] | None:
    """The device's peak memory bandwidth (bytes/s) and compute (FLOP/s), or None where unknown."""
    if device.kind != "cuda":
        return None
    words = set(device.name.replace("-", " ").split())
    for name, bandwidth, flops in PEAKS:
        if set(name.split()) <= words:
            return bandwidth, flops
    return None


def smallest(facts: Sequence[ModelFacts]) -> ModelFacts | None:
    """The target's own facts among trials' estimates: a trial with a draft counts the draft's too."""
    return min(facts, key=lambda f: (f.weights_bytes, f.kv_bytes_per_token), default=None)


def start_costs(device: Device, facts: ModelFacts | None) -> tuple[float, ...] | None:
    """The cost of each of ``TARGET_FEATURES`` at the roofline, or None where the GPU or model is unknown."""
    peaks = peaks_of(device)
    if peaks is None or facts is None or facts.weights_bytes <= 0:
        return None
    bandwidth, flops = peaks[0] * EFFICIENCY, peaks[1] * EFFICIENCY
    parameters = facts.weights_bytes / BYTES_PER_PARAMETER
    costs = {
        "iteration": facts.weights_bytes / bandwidth,
        "token": FLOPS_PER_PARAMETER * parameters / flops,
        "sequence": 0.0,
        "prefill_attention": 0.0,
        "decode_context": 1e6 * facts.kv_bytes_per_token / bandwidth,  # per million tokens read
    }
    return tuple(costs[name] for name in TARGET_FEATURES)
