"""An OpenAI ``/v1/completions`` streaming server that answers instantly, for load-generator benchmarks.

Run as its own process (``python -m tests.benchmarks._instant_server``) so it never shares the
client's event loop or GIL. It prints its port on the first line of stdout, then serves until
killed or until its stdin (a pipe from the benchmark) closes. Plain asyncio streams: HTTP/1.1
keep-alive, the request body read by ``Content-Length``, and one prebuilt response written at
once: chunked transfer encoding carrying ``CHUNKS`` SSE text events with continuous usage, a
usage-only event, then ``data: [DONE]``. The server does no other
work, so what a client measures against it is the client's own cost plus the loopback round trip.
``GET /stats`` answers the connections accepted and completions served so far, so a benchmark can
tell whether a client reuses its keep-alive connections.
"""

from __future__ import annotations

import asyncio
import json
import sys

CHUNKS = 3
PROMPT_TOKENS = 900


def _event(payload: object) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def _completion(i: int, with_text: bool) -> dict[str, object]:
    choices = [{"index": 0, "text": f" tok{i}", "logprobs": None, "finish_reason": None}] if with_text else []
    usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": i, "total_tokens": PROMPT_TOKENS + i}
    return {
        "id": "cmpl-instant",
        "object": "text_completion",
        "created": 0,
        "model": "instant",
        "choices": choices,
        "usage": usage,
    }


def build_response() -> bytes:
    events = [_event(_completion(i, True)) for i in range(1, CHUNKS + 1)]
    events += [_event(_completion(CHUNKS, False)), _event("[DONE]")]
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n"
    )
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return head + body + b"0\r\n\r\n"


RESPONSE = build_response()


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


COUNTS = {"connections": 0, "requests": 0}


def _stats_response() -> bytes:
    body = json.dumps(COUNTS).encode()
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    COUNTS["connections"] += 1
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET /stats "):
                writer.write(_stats_response())
                continue
            length = _content_length(head)
            if length:
                await reader.readexactly(length)
            COUNTS["requests"] += 1
            writer.write(RESPONSE)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass  # the client closed its keep-alive connection
    finally:
        writer.close()


async def serve() -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    # stdin is a pipe from the benchmark: its end means the benchmark is gone, even killed outright
    orphaned = asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    async with server:
        await asyncio.wait(
            [orphaned, asyncio.ensure_future(server.serve_forever())], return_when=asyncio.FIRST_COMPLETED
        )


if __name__ == "__main__":
    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        sys.exit(0)
