"""Why the performance model misses on the capacity table: each candidate cause, measured from the table's own steps.

``bench_model`` prints these next to its leave-one-out figures, so the report says from numbers
which causes are real and how far the truth itself can be predicted:

* per-request overhead outside the engine (HTTP, tokenising): the client's mean TTFT against the
  server's own (``server_ttft_mean_ms``), step by step;
* the arrival process: the recorded send times against the seeded releases the simulator uses;
* the prefix cache: the hit rate the counters showed in the smallest KV pools against the largest,
  and the preemptions (the simulator's cache never evicts);
* the fitted latencies: the full fit's simulated TTFT and decode time against the measured ones,
  request by request on the recorded steps (the median of log(simulated / measured));
* the truth's own noise: configs identical in effect (the same but for the memory fraction, every
  pool holding ``max_num_seqs`` of the longest request with its speculative tokens) were each served
  once, so their ladders' log ratio has twice a single measurement's variance. From that spread, the
  share a perfect predictor would have within 20 % of one measurement, and the band a prediction
  honestly carries.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping
from typing import Any

from tuner.engines.base import Device
from tuner.engines.vllm import VllmAdapter
from tuner.measure.capacity import request_ms
from tuner.search.model.fit import Fit
from tuner.search.model.history import Served, observed
from tuner.search.model.simulate import simulate
from tuner.workloads.arrivals import Arrival, release_times

WITHIN = 0.20  # the goal band
BAND_Z = 1.645  # a two-sided 90 % band of one measurement's log noise


def client_overhead_ms(served: Mapping[str, Served]) -> float:
    """The median over steps of the client's mean TTFT less the server's own mean TTFT."""
    gaps = []
    for s in served.values():
        for step in s.steps:
            server = step.server.get("server_ttft_mean_ms")
            ttfts = [t[0] for row in step.rows if (t := request_ms(row)) is not None]
            if isinstance(server, int | float) and ttfts:
                gaps.append(statistics.mean(ttfts) - float(server))
    return statistics.median(gaps) if gaps else math.nan


def arrival_gaps_s(served: Mapping[str, Served], burstiness: float, seed: int) -> tuple[float, float]:
    """The median and the largest gap between a recorded send time and the simulator's release for it."""
    gaps = []
    for s in served.values():
        for step in s.steps:
            sent = sorted(float(r["sent_s"]) for r in step.rows)
            released = release_times(len(sent), Arrival(rate=step.rate_req_s, burstiness=burstiness), seed)
            gaps += [abs(a - float(b or 0.0)) for a, b in zip(sent, released, strict=True)]
    return (statistics.median(gaps), max(gaps)) if gaps else (math.nan, math.nan)


def cache_by_pool(served: Mapping[str, Served]) -> dict[str, float]:
    """The median prefix-cache hit rate of the steps in the smallest and in the largest KV pools, and
    the preemptions all steps counted."""
    pools = sorted({s.kv_tokens for s in served.values() if s.kv_tokens})

    def median_hit(kv: int) -> float:
        hits = [float(h) for s in served.values() if s.kv_tokens == kv for step in s.steps
                if isinstance(h := step.server.get("prefix_cache_hit_rate"), int | float)]  # fmt: skip
        return statistics.median(hits) if hits else math.nan

    preemptions = sum(float(step.server.get("preemptions") or 0.0) for s in served.values() for step in s.steps)
    return {"small_kv_tokens": pools[0], "small_hit": median_hit(pools[0]), "large_kv_tokens": pools[-1],
            "large_hit": median_hit(pools[-1]), "preemptions": preemptions}  # fmt: skip


def latency_bias(
    served: Mapping[str, Served], fit: Fit, acceptance: Mapping[str, float], device: Device
) -> dict[str, float]:
    """The median log(simulated / measured) of TTFT and of the decode time (first to last token) over
    every recorded request, under ``fit``; negative: the model serves faster than the engine did."""
    ttft, decode = [], []
    for s in served.values():
        for step in observed(s, VllmAdapter(), device, acceptance.get(str(s.params.get("draft_model")), 0.0)):
            theta = fit.theta(step.spec)
            if theta is None:
                continue
            lines = simulate(step.works, step.limits, theta, step.spec)
            for work, line, first, done in zip(step.works, lines, step.first_s, step.done_s, strict=True):
                if None in (first, done, line.first_s, line.done_s):
                    continue
                assert first is not None and done is not None and line.first_s is not None and line.done_s is not None
                ttft.append(math.log((line.first_s + fit.overhead_s - work.arrival_s) / (first - work.arrival_s)))
                if done - first > 0 and line.done_s > line.first_s:
                    decode.append(math.log((line.done_s - line.first_s) / (done - first)))
    return {"ttft": statistics.median(ttft), "decode": statistics.median(decode), "requests": len(ttft)}


def equivalent_pairs(served: Mapping[str, Served]) -> list[tuple[str, str]]:
    """Configs that differ only in the memory fraction and whose pools all hold ``max_num_seqs`` of
    the longest request (prompt, output and speculative tokens): the same engine in effect."""
    longest = max(int(r["prompt_tokens"] or 0) + int(r["output_tokens"] or 0)
                  for s in served.values() for step in s.steps for r in step.rows)  # fmt: skip
    groups: dict[str, list[str]] = {}
    for key, s in served.items():
        seqs = int(s.params.get("max_num_seqs") or 0)
        need = seqs * (longest + int(s.params.get("num_speculative_tokens") or 0))
        if not seqs or s.kv_tokens is None or s.kv_tokens < need:
            continue
        rest = {k: v for k, v in s.params.items() if k != "memory_fraction"}
        groups.setdefault(json.dumps(rest, sort_keys=True), []).append(key)
    return [(a, b) for keys in groups.values() for i, a in enumerate(keys) for b in keys[i + 1 :]]


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def noise_floor(pairs: list[tuple[str, str]], truth: Mapping[str, Mapping[str, float]], tier: str) -> dict[str, Any]:
    """One measurement's log noise under ``tier`` from the pairs' ladders (their log ratio's RMS over
    sqrt 2), the share of configs a perfect predictor would have within ``WITHIN`` of one measurement,
    and the half-width of the band (``BAND_Z`` sigmas) a prediction carries from that noise alone."""
    ratios = [math.log(truth[a][tier] / truth[b][tier]) for a, b in pairs if truth[a][tier] > 0 and truth[b][tier] > 0]
    if not ratios:
        return {"pairs": 0, "sigma": math.nan, "perfect_within": math.nan, "band": math.nan}
    sigma = math.sqrt(sum(r * r for r in ratios) / len(ratios) / 2)
    # predicted / measured within [1 - WITHIN, 1 + WITHIN] <=> log(measured / truth) in [-ln(1+W), -ln(1-W)]
    within = _phi(-math.log(1 - WITHIN) / sigma) - _phi(-math.log(1 + WITHIN) / sigma)
    return {"pairs": len(ratios), "sigma": sigma, "perfect_within": within, "band": math.exp(BAND_Z * sigma) - 1,
            "ratios": [round(math.exp(r), 3) for r in ratios]}  # fmt: skip


def in_band(rows: list[dict[str, Any]], tier: str, sigma: float) -> int:
    """How many configs' measurements lie inside the prediction's noise band (``BAND_Z`` sigmas)."""
    return sum(1 for r in rows if (p := r[f"{tier}_predicted"]) and r[f"{tier}_measured"] > 0
               and abs(math.log(p / r[f"{tier}_measured"])) <= BAND_Z * sigma)  # fmt: skip
