#!/usr/bin/env bash
# Launch file exported by tuner 0.1.0 at 2026-12-01T00:00:00+00:00
# study: joint/../export test  trial: 0 (sampled)
# engine: sglang 0.5.23 (sglang)
# hardware: NVIDIA H200
# model: /models/target
# workload: rag  digest: eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee
# measured: ttft_p95_ms=120 [95% CI 111-132]  output_throughput_tok_s=75 [95% CI 70.2-79.9]
# repeats output_throughput_tok_s: mean 74.1, 95% CI [71, 77.2], n=5
# stress check: 996 prompt tokens x concurrency 4, cold cache: TTFT p95 250 ms, passed
# verdict: trial 0 wins on goodput_req_s (its 95 % interval clears the runner-up's)
# Override the interpreter with ENGINE_PYTHON, the address with HOST and PORT.
set -euo pipefail
ENGINE_PYTHON=${ENGINE_PYTHON:-/envs/sglang/bin/python}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-30000}
exec "$ENGINE_PYTHON" -m sglang.launch_server \
  --model-path \
  '/models/my '"'"'target'"'"'' \
  --context-length \
  2048 \
  --enable-metrics \
  --chunked-prefill-size \
  2048 \
  --mem-fraction-static \
  0.85 \
  --max-running-requests \
  8 \
  --speculative-algorithm \
  STANDALONE \
  --speculative-draft-model-path \
  '/models/draft two' \
  --speculative-num-steps \
  3 \
  --speculative-eagle-topk \
  1 \
  --speculative-num-draft-tokens \
  4 \
  --host "$HOST" --port "$PORT"
