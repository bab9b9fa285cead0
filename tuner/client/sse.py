"""One streamed request: send it, read its server-sent events, time every chunk that carries text.

Every request streams with usage (``stream_options.include_usage`` and ``continuous_usage_stats``)
so each text chunk's token count is known even when the server batches several tokens into one
chunk. The response text is kept too: a multi-turn session sends it back in its next turn.

Nothing a request does raises out of ``send``: a failure is a ``RequestRecord`` with a short
``error``, because a trial's error rate is a measurement, not a crash.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True)
class RequestRecord:
    """Timings (``time.perf_counter`` seconds) and token counts of one request.

    ``scheduled_s`` is when an open loop meant to send it (its lag behind ``sent_s`` is the load
    generator's own delay); None in a closed loop and for a session's later turns.
    """

    request_id: str
    sent_s: float
    first_token_s: float | None
    done_s: float | None
    token_times_s: tuple[float, ...]
    chunk_tokens: tuple[int, ...]
    output_tokens: int
    prompt_tokens: int
    error: str | None
    scheduled_s: float | None = None
    detail: str | None = None  # the server's own words for ``error`` (an HTTP error's body), on one line


@dataclass
class _Stream:
    """Mutable per-request accumulator; frozen into a RequestRecord once the request ends."""

    token_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    last_byte_s: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    on_first_token: Callable[[float], None] | None = None  # told the first token's time as it arrives


async def send(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], request_id: str, timeout_s: float,
    on_first_token: Callable[[float], None] | None = None,
) -> tuple[RequestRecord, str]:  # fmt: skip
    """POST ``payload`` (streaming options added) to ``url``; the record and the response text.
    ``on_first_token(t)`` hears of the first token while the request still runs (a step's monitor)."""
    payload = {**payload, "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    stream = _Stream(on_first_token=on_first_token)
    detail: str | None = None
    sent_s = time.perf_counter()
    try:
        async with asyncio.timeout(timeout_s), client.stream("POST", url, json=payload) as response:
            if response.status_code != 200:
                detail = _error_text(await response.aread())
                stream.last_byte_s = time.perf_counter()
                error: str | None = f"HTTP {response.status_code}"
            else:
                error = await _read_sse(response, stream)
    except (TimeoutError, httpx.TimeoutException):
        error = "timeout"
    except Exception as exc:  # connection resets, protocol errors...: recorded, never raised
        error = type(exc).__name__
    times = tuple(stream.token_times_s)
    record = RequestRecord(
        request_id=request_id,
        sent_s=sent_s,
        first_token_s=times[0] if times else None,
        done_s=stream.last_byte_s,
        token_times_s=times,
        chunk_tokens=tuple(stream.chunk_tokens),
        output_tokens=stream.completion_tokens,
        prompt_tokens=stream.prompt_tokens,
        error=error,
        detail=detail,
    )
    return record, "".join(stream.text)


def _error_text(body: bytes) -> str | None:
    """The message of an error response's body (OpenAI's ``{"error": {"message"}}``, vLLM's
    ``{"message"}``, FastAPI's ``{"detail"}``, or plain text), on one line of at most 200 characters."""
    text = body.decode("utf-8", "replace")
    try:
        parsed: Any = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        inner = parsed.get("error") or parsed
        if isinstance(inner, dict):
            inner = inner.get("message") or inner.get("detail") or inner
        text = str(inner)
    return " ".join(text.split())[:200] or None


async def _read_sse(response: httpx.Response, stream: _Stream) -> str | None:
    """Consume one SSE body into ``stream``; returns the error text, or None on a clean [DONE]."""
    done = False
    async for line in response.aiter_lines():
        if done:
            continue  # read to the end, so the connection returns to the pool instead of being closed
        now = time.perf_counter()
        stream.last_byte_s = now
        if not line.startswith("data:"):
            continue  # blank separators, comments and event names carry nothing we time
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
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
    return None if done else "stream ended without [DONE]"


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
        if not stream.token_times_s and stream.on_first_token is not None:
            stream.on_first_token(now)
        stream.token_times_s.append(now)
        stream.text.append(str(text))
        # continuous usage tells how many tokens this chunk carried; without it, count one
        carried = stream.completion_tokens - seen_tokens if isinstance(usage, dict) else 1
        stream.chunk_tokens.append(max(carried, 1))
