"""A continuous-batching server in a few lines, for the saturation test and its benchmark.

Every iteration takes ``iteration_s + per_seq_s * n`` for the ``n`` requests it holds and gives each
one token; a request joins at the next iteration after it is sent. So, as on a real engine, a request
lives longer the larger the batch it joins, and the number in flight wanders by more than Poisson
noise (a burst slows every request, which holds the burst longer). Its token rate tends to
``1 / per_seq_s``: a Poisson rate whose tokens exceed that can never be carried. The defaults follow
the H200's `rag` answers (256-768 tokens; reports/gpu-h200/capacity-check-5/NOTES.md), not its
speed: they make a server that carries about 12 req/s.
"""

from __future__ import annotations

import random
from typing import Any

ITERATION_S = 0.006  # an iteration's fixed time
PER_SEQ_S = 0.00016  # and its time per request it holds
TOKENS = (256, 768)  # an answer's tokens, uniform


def carried(rate: float) -> bool:
    """Whether the server carries Poisson ``rate``: its mean answer's tokens under its token rate."""
    return rate * sum(TOKENS) / 2 < 1 / PER_SEQ_S


def batched_rows(
    rate: float, duration_s: float, seed: int, *, iteration_s: float = ITERATION_S, per_seq_s: float = PER_SEQ_S,
    tokens: tuple[int, int] = TOKENS, prefill_s: float = 0.0,
) -> list[dict[str, Any]]:  # fmt: skip
    """The rows (sent_s, first_s, done_s, ...) of ``duration_s`` of seeded Poisson arrivals at ``rate``,
    each served to its end. ``prefill_s``: what each request joining an iteration adds to it (its
    prompt), so a burst of arrivals delays every first token and every running answer at once."""
    rng = random.Random(seed)
    arrivals: list[tuple[float, int]] = []
    at = rng.expovariate(rate)
    while at <= duration_s:
        arrivals.append((at, rng.randint(*tokens)))
        at += rng.expovariate(rate)
    now, nxt, rows = 0.0, 0, []
    running: list[dict[str, Any]] = []
    while nxt < len(arrivals) or running:
        if not running and arrivals[nxt][0] > now:
            now = arrivals[nxt][0]
        joined = 0
        while nxt < len(arrivals) and arrivals[nxt][0] <= now:
            sent, out = arrivals[nxt]
            running.append({"sent_s": sent, "first_s": None, "left": out, "output_tokens": out})
            nxt += 1
            joined += 1
        now += iteration_s + per_seq_s * len(running) + prefill_s * joined
        for r in running:
            r["first_s"] = now if r["first_s"] is None else r["first_s"]
            r["left"] -= 1
            if r["left"] == 0:
                rows.append({"sent_s": r["sent_s"], "first_s": r["first_s"], "done_s": now,
                             "output_tokens": r["output_tokens"], "prompt_tokens": 100, "error": None})  # fmt: skip
        running = [r for r in running if r["left"] > 0]
    return sorted(rows, key=lambda r: r["sent_s"])
