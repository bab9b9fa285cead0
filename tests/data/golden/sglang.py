#!/usr/bin/env python3
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
# Run with the engine environment's Python; HOST and PORT come from the environment.
import os
import signal

import sglang

KWARGS = {   'model_path': "/models/my 'target'",
    'context_length': 2048,
    'enable_metrics': True,
    'chunked_prefill_size': 2048,
    'mem_fraction_static': 0.85,
    'max_running_requests': 8,
    'speculative_algorithm': 'STANDALONE',
    'speculative_draft_model_path': '/models/draft two',
    'speculative_num_steps': 3,
    'speculative_eagle_topk': 1,
    'speculative_num_draft_tokens': 4}

if __name__ == "__main__":
    address = {"host": os.environ.get("HOST", "127.0.0.1"), "port": int(os.environ.get("PORT", "30000"))}
    runtime = sglang.Runtime(**KWARGS, **address)
    print(runtime.url, flush=True)
    try:
        signal.pause()
    finally:
        runtime.shutdown()
