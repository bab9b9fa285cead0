"""The stress check: a config that starts fine must also survive the workload's worst moment.

Before a config is exported as a winner it serves the workload's *longest* requests at the
workload's *peak* concurrency, with a cold cache: the prefix cache is emptied first, then the
``STRESS_ROUNDS`` x peak-concurrency longest distinct requests of the workload (cycled when it has
fewer) are sent in a closed loop at that concurrency. They are the workload's own requests, so what
they share (a RAG preamble, a system prompt) they share as real traffic does; an open-loop trial
that rarely had many requests in flight meets its whole cap of concurrency here.

Judgement (``judge``). The engine default, stressed first, is the reference: what the peak does to
the default is what it does to this hardware, so the default is judged on survival alone.

* the server died, or more than ``MAX_ERROR_RATE`` of the stress requests failed: ``oom_load``
  when the log since the stress started shows an out-of-memory signature or the engine was killed
  by SIGKILL (the kernel's OOM killer), ``crash_on_request`` otherwise;
* it survived but broke an SLO bound at peak, by more than ``PEAK_TOLERANCE`` times both its own
  trial's figure and the default's under the same stress: ``slo_collapse``. Survival alone is not
  the test: a KV cache that is too small makes requests queue without a single error (on an H200 a
  small memory fraction queued most of its peak load, its TTFT several times the default's, with no
  error: reports/search_stress.md builds the same case on the CPU build). Both references, whether
  or not the trial met the bound:
  a config slow everywhere (no worse at peak than in its trial) or a peak that slows the default
  as much is not a collapse, and a config that missed the bound in its trial cannot pass by that
  alone however far past it it goes. Where the default was not stressed, its own trial is the one
  reference;
* it survived, but its TTFT p95 at peak is more than ``COLLAPSE_FACTOR`` times both its own trial's
  and the default's under the same stress: ``slo_collapse``. This is the rule a capacity objective
  keeps (its trials met their SLO at a rate, not at the stress run's concurrency, so no bound is
  judged there): a collapse shows even where no SLO applies, while a config that is merely slow
  everywhere (no worse at peak than in its trial) is not called one;
* otherwise None: it passed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from tuner.engines.base import EngineAdapter
from tuner.measure.failures import OOM_CLASSES, match_signature
from tuner.measure.metrics import MAX_ERROR_RATE
from tuner.workloads.base import Request, Workload

STRESS_ROUNDS = 2
VERSION = 2  # 1 sent unique copies of the single longest request (no sharing at all): too harsh
COLLAPSE_FACTOR = 3.0
# A broken bound is judged tighter than the TTFT rule below (COLLAPSE_FACTOR), but a stress run is a
# few dozen requests, so its p95 is nearly its maximum and noisy: twice the references, not a hair over.
PEAK_TOLERANCE = 2.0
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
    default_stress: Mapping[str, float] | None = None,
    adapter: EngineAdapter | None = None,
) -> str | None:
    """The failure class the stress run earns (see the module docstring), or None when it passed.

    ``default_stress`` is the engine default's metrics under the same stress (for the default
    itself, its own); None where the default was not stressed. ``adapter``: the engine's, whose
    log lines tell an out-of-memory death (None: only the signatures every engine shares)."""
    if not alive or stress.get("error_rate", 1.0) > MAX_ERROR_RATE:
        oom = killed or match_signature(log_since_stress, adapter) in OOM_CLASSES
        return "oom_load" if oom else "crash_on_request"
    reference = default_stress or {}
    for key, bound in slo.items():
        metric = _P95.get(key, key)
        at_peak = stress.get(metric, math.inf)
        if at_peak <= bound:
            continue
        baseline = max(trial.get(metric, math.inf), reference.get(metric, -math.inf))
        if not at_peak <= PEAK_TOLERANCE * baseline:
            return "slo_collapse"
    ttft, own = stress.get("ttft_p95_ms", math.inf), trial.get("ttft_p95_ms", math.inf)
    default_ttft = reference.get("ttft_p95_ms")
    if default_ttft and default_ttft > 0 and not ttft <= COLLAPSE_FACTOR * max(default_ttft, own):
        return "slo_collapse"
    return None
