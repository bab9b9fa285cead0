"""What every preset declares, and the assembly of its requests into a ``Workload``.

A preset is a documented definition: how its requests are made (``make``), how they arrive by
default (``arrival``) and the service-level objectives that suit it (``slo``). ``assemble`` applies
the arrival pattern the run uses: open-loop release times go on the first request of each unit
(an independent request or a session), drawn from a generator of their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
