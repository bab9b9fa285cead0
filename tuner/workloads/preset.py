"""What every preset declares, and the assembly of its requests into a ``Workload``.

A preset is a documented definition: how its requests are made (``make``), how they arrive by
default (``arrival``) and the service-level objectives that suit it (``slo``). ``assemble`` applies
the arrival pattern the run uses: open-loop release times go on the first request of each unit
(an independent request or a session), drawn from a generator of their own.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace

from tokenizers import Tokenizer

from tuner.workloads.arrivals import Arrival, in_flight_cap, release_times
from tuner.workloads.base import Request, Slo, Tiers, Workload


@dataclass(frozen=True)
class Drafted:
    """A preset's requests before the arrival pattern is applied."""

    requests: list[Request]
    warmup: list[Request]
    description: str  # lengths, sharing and outputs, in one line


@dataclass(frozen=True)
class Preset:
    name: str
    arrival: Arrival
    slo: Slo
    # make(tokenizer, seed, n_requests, max_model_len, n_warmup)
    make: Callable[[Tokenizer, int, int, int, int], Drafted]
    tiers: Tiers = Tiers()  # the capacity objective's SLO tiers
    # make_range(tokenizer, seed, start, stop, max_model_len): measured requests start..stop-1 alone, for
    # a preset whose request i does not depend on the others (None: grow by building it all again)
    make_range: Callable[[Tokenizer, int, int, int, int], list[Request]] | None = None
    # with_reuse(share): the same preset with ``share`` of each prompt a prefix shared with earlier
    # requests (``--prefix-reuse``); None: the preset's sharing is fixed by its structure
    with_reuse: Callable[[float], Preset] | None = None


def assemble(
    name: str, seed: int, drafted: Drafted, arrival: Arrival, slo: Slo, tiers: Tiers | None = None
) -> Workload:
    """The workload a trial drives: ``drafted`` released as ``arrival`` says."""
    requests = _released(drafted.requests, arrival, seed)
    n_units = len({r.session_id or r.request_id for r in requests})
    return Workload(
        name=name,
        seed=seed,
        requests=tuple(requests),
        warmup=tuple(drafted.warmup),
        concurrency=in_flight_cap(arrival, n_units),
        description=f"{drafted.description}; {arrival.describe()}",
        arrival=arrival,
        slo=slo,
        tiers=tiers or Tiers(),
    )


def _released(requests: Sequence[Request], arrival: Arrival, seed: int) -> list[Request]:
    """Requests with the release times ``arrival`` gives: recorded ones kept, seeded, or none."""
    if arrival.recorded:
        return list(requests)
    if arrival.rate is None:
        return [replace(r, arrival_s=None) for r in requests]
    seen: set[str] = set()
    firsts = []
    for index, request in enumerate(requests):
        unit = request.session_id or request.request_id
        if unit not in seen:
            seen.add(unit)
            firsts.append(index)
    at = dict(zip(firsts, release_times(len(firsts), arrival, seed), strict=True))
    return [replace(r, arrival_s=at.get(i)) for i, r in enumerate(requests)]


def split_count(n_requests: int, turns: Sequence[int]) -> list[int]:
    """Cut a list of session lengths so that they add up to ``n_requests`` exactly."""
    kept: list[int] = []
    for n_turns in turns:
        left = n_requests - sum(kept)
        if left <= 0:
            break
        kept.append(min(n_turns, left))
    return kept


PARALLEL_FROM = 256  # fewer new requests than this are built in this process: workers cost a second to start
CHUNK = 128


def grow(
    preset: Preset, tokenizer: Tokenizer, seed: int, max_model_len: int, have: Sequence[Request], n: int
) -> list[Request]:
    """The measured requests ``len(have)`` to ``n`` (excluded) of a ``make_range`` preset, built in
    worker processes when there are many (a GPU search at its capacity needs thousands a minute),
    except in a process that may not start any."""
    assert preset.make_range is not None
    start = len(have)
    if n <= start:
        return []
    # a daemonic process (a pool's worker: the performance model's predictions grow the study's
    # requests in theirs, tuner.search.model.parallel) may not start processes of its own
    if n - start < PARALLEL_FROM or multiprocessing.current_process().daemon:
        return preset.make_range(tokenizer, seed, start, n, max_model_len)
    bounds = [(a, min(a + CHUNK, n)) for a in range(start, n, CHUNK)]
    workers = max(1, min(len(bounds), (os.cpu_count() or 1)))
    context = multiprocessing.get_context("spawn")  # no fork of a process that runs threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        n_chunks = len(bounds)
        starts, stops = [a for a, _ in bounds], [b for _, b in bounds]
        parts = pool.map(
            preset.make_range, [tokenizer] * n_chunks, [seed] * n_chunks, starts, stops, [max_model_len] * n_chunks
        )
        return [r for part in parts for r in part]
