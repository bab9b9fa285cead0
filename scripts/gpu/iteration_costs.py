"""Time one engine iteration's parts for the 8B-shaped target on this GPU, with torch alone (issue 27).

Run on the GPU machine with the image's torch: ``/opt/torch/.venv/bin/python scripts/gpu/iteration_costs.py
OUT.json``. It boots no engine and needs no model files: the shapes are the generated target's
(``make_models.py --shape llama-8b``: 32 layers, hidden 4096, MLP 14336, 32 query and 8 KV heads of
128), with random bf16 weights, since an iteration's time does not depend on the weights' values.

Why: the performance model prices an iteration as a fixed cost plus a cost per token (and per
sequence, per attended context token), fitted from request times alone. On study 1's H200 steps that
fit leaves a large error and simulates every step too slow (reports/gpu-h200/study-1/block2/NOTES.md).
This measures the parts directly:
- the linear layers of a whole forward pass for T tokens (what a prefill chunk or a decode batch
  costs apart from attention), for T from 1 to 8192;
- decode attention: B sequences, one query token each, over C context tokens;
- prefill attention: a chunk of T query tokens over its request's context so far.
Each figure is the median of timed repeats after a warm-up, by CUDA events.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, MLP, HEADS, KV_HEADS, HEAD_DIM = 32, 4096, 14336, 32, 8, 128
REPEATS = 20


def timed(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    """Median seconds of one call, after two warm-up calls."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000.0)
    return statistics.median(times)


def main() -> None:
    out_path = sys.argv[1]
    dev = torch.device("cuda")
    bf = torch.bfloat16
    # one layer's weights per layer, so every layer reads its own from memory as an engine does
    layers = [
        {
            "qkv": torch.randn(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM, device=dev, dtype=bf) * 0.02,
            "o": torch.randn(HEADS * HEAD_DIM, HIDDEN, device=dev, dtype=bf) * 0.02,
            "gate_up": torch.randn(HIDDEN, 2 * MLP, device=dev, dtype=bf) * 0.02,
            "down": torch.randn(MLP, HIDDEN, device=dev, dtype=bf) * 0.02,
        }
        for _ in range(LAYERS)
    ]
    weight_bytes = sum(w.numel() * w.element_size() for layer in layers for w in layer.values())
    result: dict = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "weight_bytes_linear": weight_bytes,
        "shape": {
            "layers": LAYERS,
            "hidden": HIDDEN,
            "mlp": MLP,
            "heads": HEADS,
            "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
        },
        "linear": [],
        "decode_attention": [],
        "prefill_attention": [],
    }

    def linear_pass(x: torch.Tensor) -> torch.Tensor:
        for w in layers:
            qkv = x @ w["qkv"]
            x = x + qkv[:, : HEADS * HEAD_DIM] @ w["o"]
            gu = x @ w["gate_up"]
            x = x + (F.silu(gu[:, :MLP]) * gu[:, MLP:]) @ w["down"]
        return x

    for tokens in (1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096, 8192):
        x = torch.randn(tokens, HIDDEN, device=dev, dtype=bf) * 0.1
        seconds = timed(lambda x=x: linear_pass(x))
        result["linear"].append({"tokens": tokens, "s": seconds})
        print(f"linear T={tokens}: {seconds * 1000:.3f} ms", flush=True)

    # decode attention of one layer (times LAYERS for the pass): B queries over C cached tokens each
    for batch in (1, 16, 64, 128, 256):
        for context in (1024, 4096):
            q = torch.randn(batch, HEADS, 1, HEAD_DIM, device=dev, dtype=bf)
            k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device=dev, dtype=bf)
            v = torch.randn_like(k)
            seconds = timed(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            result["decode_attention"].append({"batch": batch, "context": context, "s_per_layer": seconds})
            print(f"decode attention B={batch} C={context}: {seconds * 1e6:.1f} us/layer", flush=True)
            del q, k, v

    # prefill attention of one layer: a chunk of T new tokens attending causally to the prompt so far
    for chunk, before in ((512, 0), (2048, 0), (2048, 2048), (4096, 0), (8192, 0)):
        q = torch.randn(1, HEADS, chunk, HEAD_DIM, device=dev, dtype=bf)
        k = torch.randn(1, KV_HEADS, before + chunk, HEAD_DIM, device=dev, dtype=bf)
        v = torch.randn_like(k)
        # causal over the new tokens, all of the earlier ones visible: a bottom-right aligned mask
        mask = torch.ones(chunk, before + chunk, device=dev, dtype=torch.bool).tril(diagonal=before)
        seconds = timed(
            lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        )
        result["prefill_attention"].append({"chunk": chunk, "context_before": before, "s_per_layer": seconds})
        print(f"prefill attention chunk={chunk} before={before}: {seconds * 1e6:.1f} us/layer", flush=True)
        del q, k, v, mask

    result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
