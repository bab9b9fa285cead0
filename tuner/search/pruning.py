"""Pruning: stop a trial whose workload is clearly going worse than configs already measured.

Every trial drives the same requests in the same order, so trials can be compared at the same
point of their workload: at each checkpoint (a quarter, a half and three quarters of the requests
completed) the running objective values are computed from the requests completed so far, exactly
as ``checkpoints`` computes them afterwards for every finished trial. A trial is pruned at a
checkpoint when a feasible finished trial was clearly better there, by ``MARGIN`` on every
objective: for the Pareto objective, a TTFT p95 at least ``1 + MARGIN`` times lower *and* an output
throughput at least ``1 + MARGIN`` times higher (the trial is dominated with room to spare); for a
single objective, a value ``1 + MARGIN`` times better. The engine default is never pruned, nor are
finalist repeats. A pruned trial is stored as PRUNED with the checkpoint, its running values and
the drive time it saved (the time left at its own pace).

Pruning is only worth it where the drive is long against the boot. A pruned trial has paid its boot
and loses its final metrics and server statistics; on an H200, where a boot takes minutes and a
one-load workload seconds, pruning saved a small share of each pruned trial's boot
(reports/gpu-h200.md, "The second lease"). So a trial is not pruned when the time it would save is
under ``MIN_SAVED_OF_BOOT`` of its own boot time: none of those H200 trials, and on the CPU build,
where boots are short too, only the long drives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuner.client.driver import RequestRecord
from tuner.measure.metrics import request_row
from tuner.measure.trial import Pruned
from tuner.search.scoring import MIN, OBJECTIVES

CHECKPOINTS = (0.25, 0.5, 0.75)
MARGIN = 0.25
MIN_REQUESTS = 8  # below this many completions a p95 is one or two requests: never judged
MIN_SAVED_OF_BOOT = 0.25  # saving under a quarter of a boot: finishing costs little and measures everything


def checkpoint_counts(n_total: int) -> list[int]:
    counts = sorted({max(int(round(q * n_total)), 1) for q in CHECKPOINTS})
    return [c for c in counts if c >= MIN_REQUESTS and c < n_total]


def running_values(done: Sequence[Mapping[str, Any]], slo: Mapping[str, float]) -> dict[str, float]:
    """Objective values over the completed rows (``request_log`` shape: seconds after the start)."""
    ok = [r for r in done if r["error"] is None and r["first_s"] is not None and r["done_s"] is not None]
    now = max((r["done_s"] for r in done if r["done_s"] is not None), default=0.0)
    ttft = [(r["first_s"] - r["sent_s"]) * 1e3 for r in ok]
    good = sum(1 for r in ok if _meets(r, slo))
    return {
        "ttft_p95_ms": float(np.percentile(ttft, 95)) if ttft else math.inf,
        "output_throughput_tok_s": sum(r["output_tokens"] for r in ok) / now if now > 0 else 0.0,
        "goodput_req_s": good / now if now > 0 else 0.0,
    }


def _meets(row: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    ttft = (row["first_s"] - row["sent_s"]) * 1e3
    e2e = (row["done_s"] - row["sent_s"]) * 1e3
    tpot = (e2e - ttft) / (row["output_tokens"] - 1) if row["output_tokens"] > 1 else 0.0
    measured = {"ttft_p95_ms": ttft, "tpot_p95_ms": tpot, "e2e_p95_ms": e2e}
    return all(measured[k] <= bound for k, bound in slo.items())


def checkpoints(request_log: Sequence[Mapping[str, Any]], slo: Mapping[str, float]) -> dict[str, dict[str, float]]:
    """The running values of a finished trial at each checkpoint, keyed by the completed count."""
    done = sorted((r for r in request_log if r["done_s"] is not None), key=lambda r: r["done_s"])
    return {str(n): running_values(done[:n], slo) for n in checkpoint_counts(len(request_log)) if n <= len(done)}


def _clearly_better(ref: Mapping[str, float], mine: Mapping[str, float], objective: str) -> bool:
    for name, direction in OBJECTIVES[objective]:
        theirs, ours = ref.get(name), mine.get(name)
        if theirs is None or ours is None:
            return False
        better = theirs * (1 + MARGIN) <= ours if direction == MIN else theirs >= ours * (1 + MARGIN) and theirs > 0
        if not better:
            return False
    return True


class FrontWatch:
    """The driver's ``on_record`` callback for one trial: raises ``Pruned`` at a checkpoint where a
    reference trial (number -> its ``checkpoints``) was clearly better."""

    def __init__(
        self, n_total: int, references: Mapping[int, Mapping[str, Mapping[str, float]]], objective: str,
        slo: Mapping[str, float], started_s: float, boot_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.n_total, self.references, self.objective, self.slo = n_total, references, objective, slo
        self.started_s, self.boot_s = started_s, boot_s
        self.counts = set(checkpoint_counts(n_total))
        self.done: list[dict[str, Any]] = []

    def __call__(self, record: RequestRecord) -> None:
        if record.done_s is None and record.error is None:
            return
        row = request_row(record, self.started_s)
        if row["done_s"] is None:  # failed before any byte: it ended now, for the throughput's clock
            row["done_s"] = time.perf_counter() - self.started_s
        self.done.append(row)
        n = len(self.done)
        if n not in self.counts:
            return
        saved_s = max(r["done_s"] for r in self.done) * (self.n_total - n) / n
        if saved_s < MIN_SAVED_OF_BOOT * self.boot_s:
            self.counts = set()  # later checkpoints would save even less: let it finish
            return
        mine = running_values(self.done, self.slo)
        for number, curve in self.references.items():
            ref = curve.get(str(n))
            if ref is not None and _clearly_better(ref, mine, self.objective):
                raise Pruned(n, self.n_total, mine, saved_s, number)
