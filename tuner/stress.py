"""The stress check: a config that starts fine must also survive the workload's worst moment.

Before a config is exported as a winner it serves the workload's *longest* request at the
workload's *peak* concurrency, with a cold cache: the prefix cache is emptied first, and every copy
of the longest request is made unique at its very start, so no copy reuses another's KV blocks.
``STRESS_ROUNDS`` copies per slot of concurrency are sent in a closed loop.

Judgement (``judge``):

* the server died, or more than ``MAX_ERROR_RATE`` of the stress requests failed: ``oom_load``
  when the log since the stress started shows an out-of-memory signature or the engine was killed
  by SIGKILL (the kernel's OOM killer), ``crash_on_request`` otherwise;
* it survived but broke an SLO bound at peak that it met in its trial: ``slo_collapse``. Survival
  alone is not the test: a KV cache that is too small makes requests queue without a single error
  (on an H200, vLLM at memory fraction 0.135 queued 53 requests at concurrency 64, TTFT p50 7.9 s
  against 0.86 s at the default, with 0 errors);
* it survived and its TTFT p95 at peak grew more than ``COLLAPSE_FACTOR`` times over the engine
  default's under the same stress (where the default was stressed too): ``slo_collapse``, so a
  collapse shows even where the SLOs are out of reach on this hardware for every config;
* otherwise None: it passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tuner.failures import OOM_CLASSES, match_signature
from tuner.workloads.base import Request, Workload

STRESS_ROUNDS = 2
COLLAPSE_FACTOR = 3.0
MAX_ERROR_RATE = 0.005
_P95 = {"ttft_p95_ms": "ttft_p95_ms", "tpot_p95_ms": "tpot_p95_ms", "e2e_p95_ms": "e2e_p95_ms"}


def peak_concurrency(workload: Workload) -> int:
    return max(int(workload.concurrency), 1)


def longest_request(workload: Workload) -> Request:
    """The request with the most prompt tokens that stands on its own (not a session's follow-up)."""
    candidates = [r for r in workload.requests if not r.extends_session] or list(workload.requests)
    return max(candidates, key=lambda r: (r.prompt_tokens + r.max_tokens, r.request_id))


def _unique(body: Mapping[str, Any], tag: str) -> dict[str, Any]:
    """The body with ``tag`` at the very start of its prompt, so no two copies share a KV block."""
    out = dict(body)
    if isinstance(out.get("prompt"), str):
        out["prompt"] = f"{tag} {out['prompt']}"
    elif isinstance(out.get("messages"), list) and out["messages"]:
        messages = [dict(m) for m in out["messages"]]
        messages[0]["content"] = f"{tag} {messages[0].get('content', '')}"
        out["messages"] = messages
    return out


def stress_requests(workload: Workload, rounds: int = STRESS_ROUNDS) -> tuple[Request, ...]:
    """``rounds`` x peak-concurrency unique copies of the longest request, closed loop."""
    longest = longest_request(workload)
    copies = []
    for i in range(rounds * peak_concurrency(workload)):
        tag = f"[stress {i:03d}]"
        copies.append(
            replace(
                longest,
                request_id=f"stress{i:03d}",
                body=_unique(longest.body, tag),
                session_id=None,
                turn=0,
                extends_session=False,
                arrival_s=None,
            )
        )
    return tuple(copies)


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
    ttft = stress.get("ttft_p95_ms", math.inf)
    if default_ttft_p95_ms and default_ttft_p95_ms > 0 and not ttft <= COLLAPSE_FACTOR * default_ttft_p95_ms:
        return "slo_collapse"
    return None
