"""The load generator: sends a workload's requests to an OpenAI-compatible server and times them.

Closed loop: exactly ``concurrency`` workers pull requests from one shared queue, so at most that
many are in flight and a new one starts as soon as one ends. Every request streams with usage
(``stream_options.include_usage`` and ``continuous_usage_stats``) so each text chunk's token count
is known even when the server batches several tokens into one chunk.

A failed request is recorded with a short ``error`` and never dropped, and nothing a request does
raises out of ``drive``: a trial's error rate is a measurement, not a crash. The client is injected
so tests can use ``httpx.MockTransport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from tuner.workloads.base import Request


@dataclass(frozen=True)
class RequestRecord:
    """Timings (``time.perf_counter`` seconds) and token counts of one request."""

    request_id: str
    sent_s: float
    first_token_s: float | None
    done_s: float | None
    token_times_s: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    output_tokens: int
    prompt_tokens: int
    error: str | None


@dataclass(frozen=True)
class DriveResult:
    records: tuple[RequestRecord, ...]
    started_s: float
    ended_s: float


@dataclass
class _Stream:
    """Mutable per-request accumulator; frozen into a RequestRecord once the request ends."""

    token_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    last_byte_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0


async def drive(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    requests: Sequence[Request],
    *,
    concurrency: int,
    request_timeout_s: float = 120.0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> DriveResult:
    """Send ``requests`` with ``concurrency`` workers; records come back in request order."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(len(requests)):
        queue.put_nowait(index)
    records: list[RequestRecord | None] = [None] * len(requests)

    async def worker() -> None:
        while not queue.empty():
            index = queue.get_nowait()
            record = await _send(client, base_url, model, requests[index], request_timeout_s)
            records[index] = record
            if on_record is not None:
                on_record(record)

    started_s = time.perf_counter()
    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*tasks)
    finally:  # an on_record error or a cancel stops the other workers too, not just this await
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    ended_s = time.perf_counter()
    return DriveResult(tuple(r for r in records if r is not None), started_s, ended_s)


def drive_sync(
    client: httpx.AsyncClient | None,
    base_url: str,
    model: str,
    requests: Sequence[Request],
    *,
    concurrency: int,
    request_timeout_s: float = 120.0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> DriveResult:
    """``drive`` in a fresh event loop; with ``client=None`` it owns a client sized for ``concurrency``."""

    async def run() -> DriveResult:
        async with contextlib.AsyncExitStack() as stack:
            active = client
            if active is None:
                limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
                own = httpx.AsyncClient(timeout=httpx.Timeout(request_timeout_s), limits=limits)
                active = await stack.enter_async_context(own)
            return await drive(
                active,
                base_url,
                model,
                requests,
                concurrency=concurrency,
                request_timeout_s=request_timeout_s,
                on_record=on_record,
            )

    return asyncio.run(run())


async def _send(
    client: httpx.AsyncClient, base_url: str, model: str, request: Request, timeout_s: float
) -> RequestRecord:
    payload: dict[str, Any] = {
        **request.body,
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    stream = _Stream()
    sent_s = time.perf_counter()
    try:
        async with (
            asyncio.timeout(timeout_s),
            client.stream("POST", base_url.rstrip("/") + request.endpoint, json=payload) as response,
        ):
            if response.status_code != 200:
                await response.aread()
                stream.last_byte_s = time.perf_counter()
                error: str | None = f"HTTP {response.status_code}"
            else:
                error = await _read_sse(response, stream)
    except (TimeoutError, httpx.TimeoutException):
        error = "timeout"
    except Exception as exc:  # connection resets, protocol errors...: recorded, never raised
        error = type(exc).__name__
    times = tuple(stream.token_times_s)
    return RequestRecord(
        request_id=request.request_id,
        sent_s=sent_s,
        first_token_s=times[0] if times else None,
        done_s=stream.last_byte_s,
        token_times_s=times,
        chunk_tokens=tuple(stream.chunk_tokens),
        output_tokens=stream.completion_tokens,
        prompt_tokens=stream.prompt_tokens,
        error=error,
    )


async def _read_sse(response: httpx.Response, stream: _Stream) -> str | None:
    """Consume one SSE body into ``stream``; returns the error text, or None on a clean [DONE]."""
    async for line in response.aiter_lines():
        now = time.perf_counter()
        stream.last_byte_s = now
        if not line.startswith("data:"):
            continue  # blank separators, comments and event names carry nothing we time
        data = line[5:].strip()
        if data == "[DONE]":
            return None
        try:
            chunk = json.loads(data)
        except ValueError:
            return "malformed SSE"
        if not isinstance(chunk, dict):
            return "malformed SSE"
        if "error" in chunk or chunk.get("object") == "error":  # a failure after the 200 was sent
            return f"server error: {str(chunk.get('error') or chunk.get('message'))[:120]}"
        try:
            _absorb_chunk(chunk, stream, now)
        except (LookupError, AttributeError, TypeError, ValueError):  # valid JSON, wrong shape
            return "malformed SSE"
    return "stream ended without [DONE]"


def _absorb_chunk(chunk: dict[str, Any], stream: _Stream, now: float) -> None:
    seen_tokens = stream.completion_tokens
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        stream.completion_tokens = int(usage.get("completion_tokens") or seen_tokens)
        stream.prompt_tokens = int(usage.get("prompt_tokens") or stream.prompt_tokens)
    choices = chunk.get("choices")
    if not choices:
        return
    choice = choices[0]
    text = choice.get("text")
    if text is None:
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else None
    if text:
        stream.token_times_s.append(now)
        # continuous usage tells how many tokens this chunk carried; without it, count one
        carried = stream.completion_tokens - seen_tokens if isinstance(usage, dict) else 1
        stream.chunk_tokens.append(max(carried, 1))
