"""tuner.client.transport against a real HTTP/1.1 server on loopback (asyncio streams in a thread), not a mock.

The server counts the connections it accepted and the most it had open at once, so keep-alive
reuse, ``Connection: close`` and the pool limit are checked where they happen: on the wire.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from tuner.client.driver import REQUEST_TIMEOUT_S, drive, drive_sync
from tuner.client.sse import send
from tuner.client.transport import StreamTransport
from tuner.workloads.base import Request

GAP_S = 0.02  # between the server's SSE chunks: streaming shows as first token well before the end


def _event(payload: object) -> bytes:
    data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


def _completion(i: int, text: bool) -> dict[str, Any]:
    return {"choices": [{"index": 0, "text": f" t{i}"}] if text else [],
            "usage": {"prompt_tokens": 7, "completion_tokens": i}}  # fmt: skip


class Server:
    """Routes by path; see each branch of ``answer``. Counts connections as they are accepted and closed."""

    def __init__(self) -> None:
        self.accepted = 0
        self.open_now = 0
        self.max_open = 0
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path = head.split(b" ")[1].decode()
                length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)  # fmt: skip
                await reader.readexactly(length)
                if not await self.answer(path, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed the connection
        finally:
            self.open_now -= 1
            self.writers.discard(writer)
            writer.close()

    async def answer(self, path: str, writer: asyncio.StreamWriter) -> bool:
        """Write the response for ``path``; False when the server then closes the connection."""
        if path.endswith("/v1/completions"):  # SSE in chunked encoding, one chunk per event, spaced out
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for i in (1, 2, 3):
                writer.write(_event(_completion(i, True)))
                await writer.drain()
                if path.startswith("/cut"):
                    return False  # hangs up mid-stream: no [DONE], no terminating chunk
                await asyncio.sleep(GAP_S)
            writer.write(_event(_completion(3, False)) + _event("[DONE]") + b"0\r\n\r\n")
        elif path.startswith("/fail"):
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\nboom")
        elif path == "/stall":
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            await asyncio.sleep(10)
        else:  # /length, and /close and /drop, which close afterwards (only /close says so)
            close = b"connection: close\r\n" if path == "/close" else b""
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: 11\r\n\r\n"
                         b'{"ok":true}' % close)  # fmt: skip
        await writer.drain()
        return path not in ("/close", "/drop")


def _serve(server: Server, ready: threading.Event, stop: list[Callable[[], object]]) -> None:
    async def main() -> None:
        done = asyncio.Event()
        listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
        server.port = listener.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        stop.append(lambda: loop.call_soon_threadsafe(done.set))
        ready.set()
        async with listener:
            await done.wait()
            for writer in list(server.writers):
                writer.close()

    asyncio.run(main())


@pytest.fixture
def servers() -> Iterator[Callable[[], Server]]:
    """Starts servers on demand, each in a thread with its own event loop; all stopped at the end."""
    stops: list[Callable[[], object]] = []
    threads: list[threading.Thread] = []

    def start() -> Server:
        server, ready = Server(), threading.Event()
        threads.append(threading.Thread(target=_serve, args=(server, ready, stops), daemon=True))
        threads[-1].start()
        assert ready.wait(5)
        return server

    yield start
    for stop in stops:
        stop()
    for thread in threads:
        thread.join(5)


@pytest.fixture
def server(servers: Callable[[], Server]) -> Server:
    return servers()


def _url(server: Server, path: str = "") -> str:
    return f"http://127.0.0.1:{server.port}{path}"


def _run(body: Callable[[httpx.AsyncClient], Awaitable[Any]], limit: int = 4, timeout: float = 5.0) -> Any:
    async def main() -> Any:
        async with httpx.AsyncClient(transport=StreamTransport(limit), timeout=timeout) as client:
            return await asyncio.wait_for(body(client), 10)  # a hang fails the test instead of stalling it

    return asyncio.run(main())


def _request(i: int) -> Request:
    body = {"prompt": "p", "max_tokens": 3, "temperature": 0.0, "ignore_eos": True}
    return Request(f"r{i:03d}", "/v1/completions", body, prompt_tokens=7, max_tokens=3)


def test_sse_streams_through_chunked_encoding(server: Server) -> None:
    result = _run(lambda c: drive(c, _url(server), "m", [_request(0)], concurrency=1))
    (record,) = result.records
    assert record.error is None and record.output_tokens == 3 and record.prompt_tokens == 7
    assert record.chunk_tokens == (1, 1, 1)
    # each chunk was timed as it arrived, not after the whole body: the server wrote the first and the
    # third 2 x GAP_S apart (half of that is slack for a busy machine), and the end GAP_S after the third
    assert record.token_times_s[2] - record.token_times_s[0] >= GAP_S
    assert record.done_s is not None and record.first_token_s is not None
    assert record.done_s - record.first_token_s >= 1.5 * GAP_S


def test_content_length_bodies_reuse_one_connection(server: Server) -> None:
    async def five_gets(client: httpx.AsyncClient) -> list[Any]:
        return [(await client.get(_url(server, "/length"))).json() for _ in range(5)]

    assert _run(five_gets) == [{"ok": True}] * 5
    assert server.accepted == 1


def test_connection_close_is_honoured_both_ways(server: Server) -> None:
    async def gets(client: httpx.AsyncClient) -> list[int]:
        said_by_server = [(await client.get(_url(server, "/close"))).status_code for _ in range(3)]
        asked = {"connection": "close"}
        said_by_client = [(await client.get(_url(server, "/length"), headers=asked)).status_code for _ in range(2)]
        return said_by_server + said_by_client

    assert _run(gets) == [200] * 5
    assert server.accepted == 5


def test_connection_the_server_dropped_while_idle_is_not_reused(server: Server) -> None:
    async def gets(client: httpx.AsyncClient) -> list[int]:
        first = await client.get(_url(server, "/drop"))  # keep-alive by its headers, then closed
        await asyncio.sleep(0.05)  # the server's FIN arrives while the connection sits in the pool
        return [first.status_code, (await client.get(_url(server, "/length"))).status_code]

    assert _run(gets) == [200, 200]
    assert server.accepted == 2


def test_stream_closed_early_closes_its_connection(server: Server) -> None:
    async def early(client: httpx.AsyncClient) -> Any:
        async with client.stream("POST", _url(server, "/v1/completions"), json={}) as response:
            async for _ in response.aiter_raw():
                break  # two events still to come on this connection
        return (await client.get(_url(server, "/length"))).json()

    assert _run(early) == {"ok": True}  # not the rest of the abandoned SSE body
    assert server.accepted == 2


def test_server_closing_mid_stream_is_an_error_not_a_hang(server: Server) -> None:
    started = time.perf_counter()
    result = _run(lambda c: drive(c, _url(server, "/cut"), "m", [_request(0), _request(1)], concurrency=1))
    assert [r.error for r in result.records] == ["RemoteProtocolError"] * 2
    assert all(r.first_token_s is not None for r in result.records)  # the first chunk did arrive
    # a hang would last the request timeout; a quarter of it leaves a busy machine its margin
    assert time.perf_counter() - started < REQUEST_TIMEOUT_S / 4 and server.accepted == 2


def test_http_500_is_recorded_and_its_connection_reused(server: Server) -> None:
    async def twice(client: httpx.AsyncClient) -> list[str | None]:
        payload = {"prompt": "p", "max_tokens": 3}
        sent = [await send(client, _url(server, path), payload, "r", 5.0) for path in ("/fail", "/v1/completions")]
        return [record.error for record, _ in sent]

    assert _run(twice) == ["HTTP 500", None]
    assert server.accepted == 1  # the error body was read to its end, so the connection stayed usable


def test_connection_refused() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connecting is refused
        url = f"http://127.0.0.1:{port}/v1/completions"
        with pytest.raises(httpx.ConnectError):
            _run(lambda c: c.get(url))
        record, _ = _run(lambda c: send(c, url, {"prompt": "p"}, "r", 5.0))
    assert record.error == "ConnectError" and record.first_token_s is None


def test_read_timeout(server: Server) -> None:
    with pytest.raises(httpx.ReadTimeout):
        _run(lambda c: c.get(_url(server, "/stall")), timeout=0.2)  # headers come, the body never does


def test_pool_never_exceeds_its_limit(server: Server) -> None:
    requests = [_request(i) for i in range(24)]
    result = _run(lambda c: drive(c, _url(server), "m", requests, concurrency=8), limit=3)
    assert all(r.error is None for r in result.records)
    assert server.max_open == 3 and server.accepted == 3  # 8 workers, 3 connections, each kept alive


def test_limit_counts_idle_connections_to_other_hosts(servers: Callable[[], Server]) -> None:
    a, b = servers(), servers()

    async def alternate(client: httpx.AsyncClient) -> list[int]:
        return [(await client.get(_url(s, "/length"))).status_code for s in (a, b, a, b)]

    assert _run(alternate, limit=1) == [200] * 4
    assert a.accepted == 2 and b.accepted == 2  # each switch closed the idle one to stay at 1


def test_drive_sync_owns_a_keep_alive_pool_sized_to_concurrency(server: Server) -> None:
    result = drive_sync(None, _url(server), "m", [_request(i) for i in range(12)], concurrency=3)
    assert [r.error for r in result.records] == [None] * 12
    assert server.accepted == 3
