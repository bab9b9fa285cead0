"""The stress check: a config that starts fine must also survive the workload's worst moment.

Before a config is exported as a winner it serves the workload's *longest* requests at the
workload's *peak* concurrency, with a cold cache: the prefix cache is emptied first, then the
``STRESS_ROUNDS`` x peak-concurrency longest distinct requests of the workload (cycled when it has
fewer) are sent in a closed loop at that concurrency. They are the workload's own requests, so what
they share (a RAG preamble, a system prompt) they share as real traffic does; an open-loop trial
that rarely had many requests in flight meets its whole cap of concurrency here.

Judgement (``judge``):

* the server died, or more than ``MAX_ERROR_RATE`` of the stress requests failed: ``oom_load``
  when the log since the stress started shows an out-of-memory signature or the engine was killed
  by SIGKILL (the kernel's OOM killer), ``crash_on_request`` otherwise;
* it survived but broke an SLO bound at peak that it met in its trial: ``slo_collapse``. Survival
  alone is not the test: a KV cache that is too small makes requests queue without a single error
  (on an H200, vLLM at memory fraction 0.135 queued 53 requests at concurrency 64, TTFT p50 7.9 s
  against 0.86 s at the default, with 0 errors);
* it survived, but its TTFT p95 at peak is more than ``COLLAPSE_FACTOR`` times both its own trial's
  and the engine default's under the same stress (where the default was stressed too):
  ``slo_collapse``. So a collapse shows even where the SLOs are out of reach on this hardware for
  every config, while a config that is merely slow everywhere (no worse at peak than in its trial),
  or a peak that is heavier for every config (the default slows as much), is not called one;
* otherwise None: it passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from tuner.measure.failures import OOM_CLASSES, match_signature
from tuner.workloads.base import Request, Workload

STRESS_ROUNDS = 2
VERSION = 2  # 1 sent unique copies of the single longest request (no sharing at all): too harsh
COLLAPSE_FACTOR = 3.0
MAX_ERROR_RATE = 0.005
_P95 = {"ttft_p95_ms": "ttft_p95_ms", "tpot_p95_ms": "tpot_p95_ms", "e2e_p95_ms": "e2e_p95_ms"}


def peak_concurrency(workload: Workload) -> int:
    return max(int(workload.concurrency), 1)


def longest_requests(workload: Workload, n: int) -> list[Request]:
    """The ``n`` longest requests that stand on their own (not a session's follow-up), cycled when
    the workload has fewer, longest first."""
    candidates = [r for r in workload.requests if not r.extends_session] or list(workload.requests)
    ranked = sorted(candidates, key=lambda r: (-(r.prompt_tokens + r.max_tokens), r.request_id))
    return [ranked[i % len(ranked)] for i in range(n)]


def stress_requests(workload: Workload, rounds: int = STRESS_ROUNDS) -> tuple[Request, ...]:
    """``rounds`` x peak-concurrency of the longest requests, as independent requests in a closed loop."""
    chosen = longest_requests(workload, rounds * peak_concurrency(workload))
    return tuple(
        replace(r, request_id=f"stress{i:03d}", session_id=None, turn=0, extends_session=False, arrival_s=None)
        for i, r in enumerate(chosen)
    )


def judge(
    stress: Mapping[str, float],
    trial: Mapping[str, float],
    slo: Mapping[str, float],
    alive: bool,
    log_since_stress: str,
    killed: bool = False,
    default_ttft_p95_ms: float | None = None,
) -> str | None:
    """The failure class the stress run earns (see the module docstring), or None when it passed."""
    if not alive or stress.get("error_rate", 1.0) > MAX_ERROR_RATE:
        oom = killed or match_signature(log_since_stress) in OOM_CLASSES
        return "oom_load" if oom else "crash_on_request"
    for key, bound in slo.items():
        met_in_trial = trial.get(_P95.get(key, key), math.inf) <= bound
        if met_in_trial and not stress.get(_P95.get(key, key), math.inf) <= bound:
            return "slo_collapse"
    ttft, own = stress.get("ttft_p95_ms", math.inf), trial.get("ttft_p95_ms", math.inf)
    if default_ttft_p95_ms and default_ttft_p95_ms > 0 and not ttft <= COLLAPSE_FACTOR * max(default_ttft_p95_ms, own):
        return "slo_collapse"
    return None
