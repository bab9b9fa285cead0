"""The engine's scheduler, simulated one iteration at a time: when each request gets its first and last token.

What it holds is what vLLM's V1 scheduler does each step (``vllm/v1/core/sched/scheduler.py``):

* continuous batching: the running requests are scheduled first, in the order they were admitted,
  each for what it still needs (the rest of its prompt, or one token plus its speculative ones),
  up to the iteration's token budget (``--max-num-batched-tokens``, the chunked-prefill budget);
* then waiting requests are admitted, first come first served, while fewer than ``max_num_seqs``
  run, budget is left and the KV pool has blocks for their chunk; a prompt longer than the budget
  is prefilled in chunks over several iterations;
* a running request that needs a block the pool lacks preempts the last admitted one, which waits
  again and later recomputes what it had (vLLM's recompute preemption); no admission in that step;
* the prefix cache: a prompt's leading blocks that an earlier request computed are not computed
  again, and a block that running requests share is held in the pool once. A hit on a cached block
  that no running request holds takes a block of the pool again (vLLM's free queue keeps cached
  blocks among the free ones, and a hit takes it out), so in a small pool the shared prefixes take
  their room as they do on the engine. The cache itself never evicts;
* speculation: a decoding request schedules 1 + K tokens and emits, on average, 1 + a + ... + a^K
  of them at a per-position acceptance a (``Speculation``); drafting takes K passes per step.

With ``Limits.prefill_first`` it runs SGLang's scheduler instead (``get_next_batch_to_run`` without
``--enable-mixed-chunk``): an iteration is either a prefill batch (the prompt being chunked first,
then waiting requests, up to the token budget) or, when no request waits to be admitted and none
is mid-prompt, a decode batch of every running request, with no token budget. Decoding requests
wait while prompts are prefilled.

An iteration costs ``Costs.theta . features`` seconds (``FEATURES``, plus a draft model's own), so a
request's first and last token times are, for a fixed schedule, linear in the costs: the start of
its busy period plus the summed features of the iterations up to then. ``tuner.search.model.fit``
uses exactly that to fit the costs.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tuner.workloads.inspection import BLOCK_TOKENS  # the KV cache's block, as the prefix cache counts it

# What one iteration holds, each with a cost per unit (seconds): the iteration itself, every token
# it computes (prefill and decode, verification included), every sequence in it, and attention
# (each computed token against its context, in millions of token pairs).
TARGET_FEATURES = ("iteration", "token", "sequence", "attention")
# Proposing speculative tokens: each drafting pass, and every token a draft runs (the step's, and
# K - 1 more per speculating sequence); a model-free lookup's costs land on the same two.
DRAFT_FEATURES = ("draft_pass", "draft_token")


@dataclass(frozen=True)
class Work:
    """A request as the scheduler sees it: when it arrives (s), its prompt tokens and the tokens it
    generates. With ``blocks`` (its prompt's full blocks, numbered so that equal numbers are equal
    prefixes), the prefix cache is simulated: when first scheduled it computes only what follows the
    leading blocks an earlier request has finished computing (vLLM counts hits at that moment too).
    Without, ``prompt_tokens`` is what it computes."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Limits:
    """One config's scheduler: token budget and sequences per iteration, the KV pool in tokens
    (None: unbounded), and whether prefill runs in iterations of its own (``prefill_first``:
    ``tuner.engines.base.SchedulerLimits`` says which engine does)."""

    token_budget: int | None
    max_seqs: int | None
    kv_tokens: int | None
    prefill_first: bool = False


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding: ``k`` tokens proposed per step (or K by batch size, ``schedule`` of
    ``(first, last, K)``, capped at ``k``), accepted each with probability ``accept`` given the one
    before was. Proposing has costs of its own (``DRAFT_FEATURES``), a draft model's passes or a
    model-free lookup's, fitted per draft."""

    draft: str
    k: int
    accept: float
    schedule: tuple[tuple[int, int, int], ...] = ()
    # the share of a request's decode steps that propose: a model-free lookup proposes only where it
    # finds a match (vLLM's ``spec_draft_share``); ``accept`` is the acceptance in the steps that do
    share: float = 1.0

    def k_at(self, batch: int) -> int:
        for first, last, k in self.schedule:
            if first <= batch <= last:
                return min(k, self.k)
        return self.k

    def emitted(self, k: int) -> float:
        """Tokens one verification step emits on average: the bonus token and the accepted run."""
        return float(sum(self.accept**i for i in range(k + 1)))


def acceptance_of(rate: float, k: int) -> float:
    """The per-position acceptance a whose accepted share at ``k`` (``(a + ... + a^k) / k``, what
    vLLM's counters give as accepted over drafted tokens) is ``rate``."""
    if k <= 0:
        return 0.0
    target = min(max(rate, 0.0), 1.0)
    low, high = 0.0, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        share = sum(mid**i for i in range(1, k + 1)) / k
        low, high = (mid, high) if share < target else (low, mid)
    return (low + high) / 2


@dataclass
class Timeline:
    """What happened to one request: its first and last token times (s), and for the fit, the start
    of the busy period each fell in and the summed features of that period's iterations up to them."""

    first_s: float | None = None
    done_s: float | None = None
    sent_s: float | None = None  # when it arrived: its own arrival, or in a closed loop a client's turn
    first_start_s: float = 0.0
    done_start_s: float = 0.0
    first_features: np.ndarray | None = None
    done_features: np.ndarray | None = None


# one request is itself only: `remove` compares identities, not fields; slots: read every iteration
@dataclass(eq=False, slots=True)
class _Request:
    index: int
    work: Work
    to_compute: int  # prompt tokens to compute (after a preemption: prompt and output so far)
    computed: int = 0
    generated: float = 0.0
    kv: int = 0  # tokens held in the KV pool
    started: bool = False  # has its first token
    looked_up: bool = False  # its prefix-cache hits are counted
    # prefix blocks it holds in the pool as shared ones (its hits, then its own prompt's full blocks
    # once computed), each counted once over every running request that holds it (``holders``)
    shared: tuple[int, ...] = ()
    moved: int = 0  # of those, the blocks it computed itself: counted in ``kv`` too, not twice
    credit: float = 0.0  # proposals owed: a decode step proposes each time it reaches one (``Speculation.share``)
    output_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        self.output_tokens = self.work.output_tokens

    def proposes(self, share: float) -> bool:
        """Whether this decode step proposes: spread evenly over the request's steps, ``share`` of them."""
        self.credit += share
        if self.credit >= 1.0 - 1e-9:
            self.credit -= 1.0
            return True
        return False


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


def pool_blocks(kv_tokens: int | None) -> float:
    """A KV pool of ``kv_tokens`` in blocks, as the scheduler counts it (None: unbounded)."""
    return _blocks(kv_tokens) if kv_tokens else math.inf


def simulate(
    works: Sequence[Work], limits: Limits, theta: np.ndarray, spec: Speculation | None = None,
    max_iterations: int = 200_000, waiting_trace: list[tuple[float, int]] | None = None,
    concurrency: int | None = None, demand: list[int] | None = None,
) -> list[Timeline]:  # fmt: skip
    """Run ``works`` through the scheduler with costs ``theta`` (over ``feature_names(spec)``);
    a request that could not finish within ``max_iterations`` keeps no done time. ``waiting_trace``,
    where given, gets (time, requests waiting to be admitted) at the start of every iteration: the
    server's waiting queue, which a capacity step samples to tell a queue that keeps growing.
    ``concurrency``: a closed loop, as the client's drive without arrivals (``tuner.client.driver``):
    that many clients send ``works`` in order, the first ones at their arrival, each next one the
    moment a request ends (its last token, or refused as larger than the pool); each timeline's
    ``sent_s`` says when. ``demand``, where given, gets the most KV blocks the run ever asked the
    pool to hold: a run whose demand stayed within its pool is the very same run with any pool at
    least that large (the pool is read nowhere else), which spares a prediction simulating it again."""
    n_features = len(TARGET_FEATURES) + (len(DRAFT_FEATURES) if spec is not None else 0)
    theta = np.asarray(theta, dtype=float)[:n_features]
    arrival = [w.arrival_s for w in works]
    turns: deque[int] = deque()  # closed loop: the requests no client has sent yet, in order
    if concurrency is not None:
        turns.extend(range(max(concurrency, 1), len(works)))
        for i in turns:
            arrival[i] = math.inf
    order = sorted(range(len(works)), key=lambda i: arrival[i])
    pending = deque(order)

    def next_turn(at: float) -> None:
        if turns:
            arrival[turns.popleft()] = at  # pending holds it last, and released ones keep their order

    timelines = [Timeline() for _ in works]
    waiting: deque[_Request] = deque()
    running: list[_Request] = []
    budget_cap = limits.token_budget if limits.token_budget else math.inf
    seqs_cap = limits.max_seqs if limits.max_seqs else math.inf
    pool = pool_blocks(limits.kv_tokens)
    used = 0  # blocks
    peak = 0  # the most blocks the pool was asked to hold (``demand``)
    cached: set[int] = set()  # prompt blocks computed so far (the cache is emptied before every step)
    holders: dict[int, int] = {}  # shared prefix blocks in the pool: how many running requests hold each

    def release(req: _Request) -> int:
        """The blocks ``req`` gives back to the pool as it ends or is preempted: its own, and each
        shared block no other running request holds."""
        freed = _blocks(req.kv) - req.moved
        for block in req.shared:
            left = holders[block] - 1
            if left:
                holders[block] = left
            else:
                del holders[block]
                freed += 1
        req.shared, req.moved = (), 0
        return freed

    now, busy_start = 0.0, 0.0
    acc = np.zeros(n_features)
    x = np.zeros(n_features)
    decode_next = False  # prefill first: the last prefill iteration admitted nothing, so decode now
    # tokens a verification of k drafts emits, per k: the innermost loop's, computed once per run
    emitted = [spec.emitted(k) for k in range(spec.k + 1)] if spec is not None else [1.0]
    every_step = spec is None or spec.share == 1.0  # each decode step proposes: no credit to keep
    prefill_first, per_block = limits.prefill_first, BLOCK_TOKENS
    for _ in range(max_iterations):
        if not waiting and not running:
            if not pending or math.isinf(arrival[pending[0]]):
                break
            now = max(now, arrival[pending[0]])
            busy_start, acc = now, np.zeros(n_features)
        while pending and arrival[pending[0]] <= now:
            i = pending.popleft()
            waiting.append(_Request(i, works[i], max(works[i].prompt_tokens, 1)))
        # prefill first (SGLang): this iteration prefills if a prompt is mid-way or a request may be
        # admitted, and decodes (every running request, no token budget) otherwise
        prefilling = limits.prefill_first and not decode_next and (
            any(r.computed < r.to_compute for r in running) or (bool(waiting) and len(running) < seqs_cap)
        )  # fmt: skip
        decode_next = False
        budget = math.inf if limits.prefill_first and not prefilling else budget_cap
        scheduled: list[tuple[_Request, int, int]] = []  # request, tokens, speculative tokens
        preempted = False
        batch = len(running)
        k_now = spec.k_at(batch) if spec is not None else 0
        index = 0
        while index < len(running) and budget > 0:
            req = running[index]
            prefill = req.computed < req.to_compute
            if prefill_first and prefill != prefilling:
                index += 1  # a decode waits for a prefill iteration to end, and the other way round
                continue
            if prefill:
                want = req.to_compute - req.computed
            elif spec is None:
                want = 1
            else:
                want = 1 + (k_now if every_step or req.proposes(spec.share) else 0)
            n = want if want <= budget else int(budget)
            kv = req.kv
            need = -(-(kv + n) // per_block) + (-kv // per_block)  # blocks of kv + n less blocks of kv
            if used + need > peak:
                peak = used + need
            itself = False  # the request preempted to make room for itself
            while used + need > pool and running:
                victim = running.pop()  # the last admitted goes back to wait, and recomputes later
                used -= release(victim)
                scheduled = [s for s in scheduled if s[0] is not victim]
                victim.to_compute = max(victim.work.prompt_tokens, 1) + int(victim.generated)
                victim.computed, victim.kv = 0, 0
                waiting.appendleft(victim)
                preempted = True
                if victim is req:
                    itself = True
                    break
            if itself:
                break
            used += need
            req.kv += n
            scheduled.append((req, n, 0 if prefill else n - 1))
            budget -= n
            index += 1
        admits = prefilling or not limits.prefill_first
        while admits and not preempted and waiting and len(running) < seqs_cap and budget > 0:
            req = waiting[0]
            if not req.looked_up and req.work.blocks is not None:
                req.looked_up = True
                hits = 0
                for block in req.work.blocks:
                    if block not in cached:
                        break
                    hits += 1
                req.to_compute = max(req.work.prompt_tokens - hits * BLOCK_TOKENS, 1)
                req.shared = req.work.blocks[:hits]
            n = int(min(req.to_compute - req.computed, budget))
            need = _blocks(req.kv + n) - _blocks(req.kv)
            for block in req.shared:  # a cached block no running request holds takes its room again
                if block not in holders:
                    need += 1
            if used + need > peak:
                peak = used + need
            if used + need > pool:
                break
            waiting.popleft()
            running.append(req)
            for block in req.shared:
                holders[block] = holders.get(block, 0) + 1
            used += need
            req.kv += n
            scheduled.append((req, n, 0))
            budget -= n
        if not scheduled:
            if prefilling and running:
                decode_next = True  # no prompt could be admitted (the pool is full): the running decode
                continue
            # nothing fits (a prompt larger than the whole pool): it can never run
            if waiting and not running:
                waiting.popleft()
                next_turn(now)
                continue
            if not pending or math.isinf(arrival[pending[0]]):
                break
            now = max(now, arrival[pending[0]])
            continue
        if waiting_trace is not None:
            waiting_trace.append((now, len(waiting)))
        x[:] = 0.0
        tokens = 0
        spec_seqs = 0
        attention = 0.0
        for req, n, k in scheduled:
            tokens += n
            attention += n * (req.kv - n + n / 2.0) / 1e6
            spec_seqs += k > 0
        x[0], x[1], x[2], x[3] = 1.0, tokens, len(scheduled), attention
        if n_features > len(TARGET_FEATURES) and spec_seqs:
            x[4] = k_now
            x[5] = tokens + max(k_now - 1, 0) * spec_seqs
        elif n_features > len(TARGET_FEATURES):
            x[5] = tokens  # the draft model prefills the prompt too
        now += float(theta @ x)
        acc += x
        for req, n, k in scheduled:
            if req.computed < req.to_compute:
                req.computed += n
                if req.computed >= req.to_compute and not req.started:
                    req.started, req.generated = True, 1.0
                    if req.work.blocks:
                        cached.update(req.work.blocks)
                        # its own full prompt blocks become shareable; one another running request
                        # computed at the same time is a copy, and stays this request's own
                        own = tuple(b for b in req.work.blocks[len(req.shared) :] if b not in holders)
                        for block in own:
                            holders[block] = 1
                        req.shared, req.moved = req.shared + own, len(own)
                    t = timelines[req.index]
                    t.first_s, t.first_start_s, t.first_features = now, busy_start, acc.copy()
            else:
                req.generated += emitted[k] if k > 0 else 1.0
                held = req.to_compute + int(req.generated)  # rejected drafts give their slots back
                used += -(-held // per_block) + (-req.kv // per_block)  # blocks of held less blocks of kv
                req.kv = held
            if req.started and req.generated >= req.output_tokens:
                t = timelines[req.index]
                t.done_s, t.done_start_s, t.done_features = now, busy_start, acc.copy()
                running.remove(req)
                used -= release(req)
                next_turn(now)
    for i, t in enumerate(timelines):
        t.sent_s = None if math.isinf(arrival[i]) else arrival[i]
    if demand is not None:
        demand.append(peak)
    return timelines


def feature_names(spec: Speculation | None) -> tuple[str, ...]:
    return TARGET_FEATURES + (DRAFT_FEATURES if spec is not None else ())
