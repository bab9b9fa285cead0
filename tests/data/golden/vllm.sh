#!/usr/bin/env bash
# Launch file exported by tuner 0.1.0 at 2026-12-01T00:00:00+00:00
# study: joint/../export test  trial: 0 (sampled)
# engine: vllm 0.32.0 (vllm)
# hardware: NVIDIA H200
# model: /models/target
# workload: rag  digest: eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
# measured: ttft_p95_ms=120 [95% CI 111-132]  output_throughput_tok_s=75 [95% CI 70.2-79.9]
# repeats output_throughput_tok_s: mean 74.1, 95% CI [71, 77.2], n=5
# stress check: 996 prompt tokens x concurrency 4, cold cache: TTFT p95 250 ms, passed
# verdict: trial 0 wins on goodput_req_s (its 95 % interval clears the runner-up's)
# Override the interpreter with ENGINE_PYTHON, the address with HOST and PORT.
set -euo pipefail
ENGINE_PYTHON=${ENGINE_PYTHON:-/envs/vllm/bin/python}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
exec "$ENGINE_PYTHON" -m vllm.entrypoints.openai.api_server \
  --model \
  '/models/my '"'"'target'"'"'' \
  --max-model-len \
  2048 \
  --enable-chunked-prefill \
  --max-num-batched-tokens \
  1024 \
  --max-num-seqs \
  8 \
  --gpu-memory-utilization \
  0.85 \
  --speculative-config \
  '{"model": "/models/draft two", "num_speculative_tokens": 3, "method": "draft_model"}' \
  --host "$HOST" --port "$PORT"
