"""The load generator: sends a workload's requests to an OpenAI-compatible server and times them.

Requests are released in units: an independent request, or a whole session (the requests that
share a ``session_id``), whose turns go one after another, each only once the previous response has
arrived. A turn that ``extends_session`` is sent after the previous turn's messages and that turn's
actual response text, so the prompt grows as a real conversation's does. When a turn fails, the
session's remaining turns are recorded as failed, never silently dropped.

Closed loop (no request has an ``arrival_s``): exactly ``concurrency`` workers pull units from one
queue, so a new unit starts as soon as one ends. Open loop: each unit starts at its ``arrival_s``
after the start whatever the server does, and ``concurrency`` caps the requests in flight; each
record keeps the time it was due (``scheduled_s``).

Nothing a request does raises out of ``drive``: a trial's error rate is a measurement, not a crash.
The client is injected so tests can use ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypedDict, Unpack

import httpx

from tuner.client.sse import RequestRecord, send
from tuner.client.transport import StreamTransport
from tuner.workloads.base import Request

__all__ = ["DriveResult", "RequestRecord", "drive", "drive_sync"]
SESSION_ABORTED = "session aborted: an earlier turn failed"


@dataclass(frozen=True)
class DriveResult:
    records: tuple[RequestRecord, ...]
    started_s: float
    ended_s: float


@dataclass
class _History:
    """What a session's next turn is sent after: the last payload's messages or prompt, and the reply."""

    payload: dict[str, Any]
    response: str


def units(requests: Sequence[Request]) -> list[list[int]]:
    """Indices of ``requests`` grouped into release units, in order of their first request."""
    grouped: dict[str, list[int]] = {}
    for index, request in enumerate(requests):
        grouped.setdefault(request.session_id or f"\0{index}", []).append(index)
    return list(grouped.values())


@dataclass
class _Run:
    """One drive: where to send, what, and the records filled in as requests end."""

    client: httpx.AsyncClient
    base_url: str
    model: str
    requests: Sequence[Request]
    timeout_s: float
    in_flight: asyncio.Semaphore
    on_record: Callable[[RequestRecord], None] | None
    on_first_token: Callable[[str, float], None] | None = None
    started_s: float = field(default_factory=time.perf_counter)
    records: list[RequestRecord | None] = field(default_factory=list)

    async def unit(self, indices: list[int]) -> None:
        """Send one unit's requests in order, each after the previous one's response."""
        history: _History | None = None
        for index in indices:
            request = self.requests[index]
            due = None if request.arrival_s is None else self.started_s + request.arrival_s
            if due is not None:
                await asyncio.sleep(max(due - time.perf_counter(), 0.0))
            if history is None and request.extends_session and index != indices[0]:
                record = _aborted(request)  # the turn it extends failed: there is nothing to extend
            else:
                payload = _payload(request, self.model, history)
                async with self.in_flight:
                    url = self.base_url.rstrip("/") + request.endpoint
                    heard = self.on_first_token
                    first = None if heard is None else partial(heard, request.request_id)
                    record, text = await send(self.client, url, payload, request.request_id, self.timeout_s, first)
                history = _History(payload, text) if record.error is None else None
            record = replace(record, scheduled_s=due)
            self.records[index] = record
            if self.on_record is not None:
                self.on_record(record)


REQUEST_TIMEOUT_S = 120.0


class DriveOptions(TypedDict, total=False):
    """What ``drive`` and ``drive_sync`` take beside the requests and the concurrency."""

    request_timeout_s: float  # REQUEST_TIMEOUT_S when not given
    on_record: Callable[[RequestRecord], None] | None  # hears of each request as it ends
    on_first_token: Callable[[str, float], None] | None  # hears (request id, time) of each first token


async def drive(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    requests: Sequence[Request],
    *,
    concurrency: int,
    **options: Unpack[DriveOptions],
) -> DriveResult:
    """Send ``requests`` (see the module docstring); records come back in request order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    timeout_s = options.get("request_timeout_s", REQUEST_TIMEOUT_S)
    run = _Run(client, base_url, model, requests, timeout_s, asyncio.Semaphore(concurrency),
               options.get("on_record"), options.get("on_first_token"))  # fmt: skip
    run.records = [None] * len(requests)
    groups = units(requests)
    if any(r.arrival_s is not None for r in requests):  # open loop: every unit on its own schedule
        tasks = [asyncio.create_task(run.unit(group)) for group in groups]
    else:
        tasks = _closed_loop(groups, concurrency, run.unit)
    try:
        await asyncio.gather(*tasks)
    finally:  # an on_record error or a cancel stops the other workers too, not just this await
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    ended_s = time.perf_counter()
    return DriveResult(tuple(r for r in run.records if r is not None), run.started_s, ended_s)


def _closed_loop(
    groups: list[list[int]], concurrency: int, run_unit: Callable[[list[int]], Awaitable[None]]
) -> list[asyncio.Task[None]]:
    queue: asyncio.Queue[list[int]] = asyncio.Queue()
    for group in groups:
        queue.put_nowait(group)

    async def worker() -> None:
        while not queue.empty():
            await run_unit(queue.get_nowait())

    return [asyncio.create_task(worker()) for _ in range(concurrency)]


def _payload(request: Request, model: str, history: _History | None) -> dict[str, Any]:
    body = dict(request.body)
    if request.extends_session and history is not None:
        before = history.payload
        if "messages" in body:
            reply = {"role": "assistant", "content": history.response}
            body["messages"] = [*before["messages"], reply, *body["messages"]]
        else:
            body["prompt"] = before["prompt"] + history.response + body["prompt"]
    return {**body, "model": model}


def _aborted(request: Request) -> RequestRecord:
    now = time.perf_counter()
    return RequestRecord(request.request_id, now, None, None, (), (), 0, 0, SESSION_ABORTED)


def drive_sync(
    client: httpx.AsyncClient | None,
    base_url: str,
    model: str,
    requests: Sequence[Request],
    *,
    concurrency: int,
    **options: Unpack[DriveOptions],
) -> DriveResult:
    """``drive`` in a fresh event loop; with ``client=None`` it owns a client sized for ``concurrency``.

    The owned client is httpx over ``tuner.client.transport.StreamTransport`` (keep-alive pool of
    ``concurrency`` connections), not httpcore, which costs twice the CPU per streamed request and
    far more at high concurrency (``bench_driver_capacity`` in reports/measurement.md).
    """

    async def run() -> DriveResult:
        async with contextlib.AsyncExitStack() as stack:
            active = client
            if active is None:
                transport = StreamTransport(max_connections=concurrency)
                timeout = httpx.Timeout(options.get("request_timeout_s", REQUEST_TIMEOUT_S))
                own = httpx.AsyncClient(transport=transport, timeout=timeout)
                active = await stack.enter_async_context(own)
            return await drive(active, base_url, model, requests, concurrency=concurrency, **options)

    # As vLLM's own benchmark client does: no garbage-collection pause may land inside a timed request.
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        return asyncio.run(run())
    finally:
        gc.enable()
        gc.unfreeze()
