#!/usr/bin/env python3
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
# Run with the engine environment's Python; HOST and PORT come from the environment.
# The engine's server through its Python entry point, exactly as `python -m` would start it.
import os
import runpy
import sys

MODULE = 'vllm.entrypoints.openai.api_server'
ARGV = [   '--model',
    "/models/my 'target'",
    '--max-model-len',
    '2048',
    '--enable-chunked-prefill',
    '--max-num-batched-tokens',
    '1024',
    '--max-num-seqs',
    '8',
    '--gpu-memory-utilization',
    '0.85',
    '--speculative-config',
    '{"model": "/models/draft two", "num_speculative_tokens": 3, "method": '
    '"draft_model"}']

if __name__ == "__main__":
    address = ["--host", os.environ.get("HOST", "127.0.0.1"), "--port", os.environ.get("PORT", "8000")]
    sys.argv = [MODULE, *ARGV, *address]
    runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
