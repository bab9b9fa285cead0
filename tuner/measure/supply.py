"""The requests a capacity search sends: each one once, in the workload's own order.

A step at a high rate needs more requests than a study's pool holds, and a pool cycled by every
step re-sends the same prompts, which a server's prefix cache then serves from memory: capacity
read that way is the capacity of a warmer workload than the user's (reports/gpu-h200.md, the issue-24
capacity check, measures searches with distinct requests). So a search takes its requests from one
``RequestSupply``: units (an independent request or a whole session) in workload order, none handed
out twice, and a step gives back the units it never released. A preset grows on demand
(``Workload.grow``: ``rag`` builds only the requests it lacks, the others are rebuilt with twice as
many), and the units already known must come back unchanged. A trace is finite: once it is used up it is replayed
from its start with its order kept, under fresh request and session ids, and the supply counts the
replayed requests so that each step can say so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from tuner.errors import WorkloadError
from tuner.workloads.base import Request, Workload

Unit = tuple[Request, ...]


def units_of(requests: Sequence[Request]) -> list[Unit]:
    """Requests grouped into release units: consecutive requests of one session form one unit."""
    units: list[list[Request]] = []
    for request in requests:
        if units and request.session_id is not None and units[-1][0].session_id == request.session_id:
            units[-1].append(request)
        else:
            units.append([request])
    return [tuple(unit) for unit in units]


def renamed(request: Request, lap: int) -> Request:
    """A request sent again on replay lap ``lap`` (0: the first pass, unchanged), under fresh ids."""
    if lap == 0:
        return request
    session = None if request.session_id is None else f"{request.session_id}~{lap}"
    return replace(request, request_id=f"{request.request_id}~{lap}", session_id=session)


class RequestSupply:
    """Hands out a search's units in order, each once; ``grow(n)`` rebuilds the workload with at least
    ``n`` requests (None: the pool is all there is, and is replayed once used up)."""

    @classmethod
    def of(cls, workload: Workload) -> RequestSupply:
        """A search's supply from its workload's measured requests, grown by the workload itself."""
        return cls(workload.requests, workload.grow)

    def __init__(self, pool: Sequence[Request], grow: Callable[[int], Sequence[Request]] | None = None) -> None:
        self._units = units_of(pool)
        if not self._units:
            raise WorkloadError("a capacity search needs at least one request in its workload")
        self._grow = grow
        self._next = 0  # index into the endless sequence of units: laps of a finite pool go on past its end

    @property
    def handed_out(self) -> int:
        """Units handed out and not given back."""
        return self._next

    def take(self, n_requests: int) -> tuple[list[Unit], int]:
        """The next units holding at least ``n_requests`` requests, and how many of those requests are
        replays of a finite pool (0 for a preset, which grows instead)."""
        chosen: list[Unit] = []
        replayed = count = 0
        while count < n_requests:
            index = self._next
            while index >= len(self._units) and self._grow is not None:
                self._extend(max(2 * self._requests(), n_requests + self._requests()))
            lap, at = divmod(index, len(self._units))
            unit = tuple(renamed(r, lap) for r in self._units[at])
            chosen.append(unit)
            count += len(unit)
            replayed += len(unit) if lap else 0
            self._next += 1
        return chosen, replayed

    def give_back(self, n_units: int) -> None:
        """The last ``n_units`` handed out were never released: the next ``take`` hands them out again."""
        if not 0 <= n_units <= self._next:
            raise ValueError(f"give_back({n_units}): only {self._next} units were handed out")
        self._next -= n_units

    def _requests(self) -> int:
        return sum(len(u) for u in self._units)

    def _extend(self, n_requests: int) -> None:
        assert self._grow is not None
        grown = units_of(self._grow(n_requests))
        known = len(self._units)
        if len(grown) <= known:  # a trace read to its end: from here on it is replayed
            self._grow = None
            return
        if [_key(u) for u in grown[: known - 1]] != [_key(u) for u in self._units[: known - 1]]:
            raise WorkloadError(
                "the workload did not grow by appending requests: a capacity search cannot keep its requests "
                "distinct with it (its preset must draw each request after the one before it)"
            )
        # The last known unit may be a session the smaller build cut short: the grown one is complete.
        self._units = self._units[: known - 1] + grown[known - 1 :]


def _key(unit: Unit) -> tuple[str, str]:
    # what the server sees of a unit's first request; release times are the step's own
    first = unit[0]
    return first.request_id, repr(first.body)
