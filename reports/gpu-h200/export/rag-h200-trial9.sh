#!/usr/bin/env bash
# Launch file exported by tuner 0.1.0 at 2026-12-01T07:07:10+00:00
# study: rag-h200  trial: 9 (sampled)
# engine: vllm 0.26.0 (vllm)
# hardware: NVIDIA H200
# model: /root/models/h200/target
# workload: rag  digest: d08ad71e5bb5b2864bdc6d0049e66a7a7af35d97e06006dd7cd2f3b8180924e8
# measured: ttft_p95_ms=109.6  output_throughput_tok_s=1764.9
# Override the interpreter with ENGINE_PYTHON, the address with HOST and PORT.
set -euo pipefail
ENGINE_PYTHON=${ENGINE_PYTHON:-/root/engines/vllm/bin/python}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
exec "$ENGINE_PYTHON" -m vllm.entrypoints.openai.api_server \
  --model \
  /root/models/h200/target \
  --max-model-len \
  2048 \
  --enable-chunked-prefill \
  --max-num-batched-tokens \
  2048 \
  --gpu-memory-utilization \
  0.75 \
  --speculative-config \
  '{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4}' \
  --host "$HOST" --port "$PORT"
