"""An httpx transport on plain asyncio streams (HTTP/1.1 only): the wire under the driver's own client.

httpcore, httpx's default wire, was the driver's largest CPU cost per streamed request (0.73 ms
at concurrency 1-8 and 5.9 ms at 64 on 2 cores, where a whole request through the driver on this
transport costs 0.36 ms: ``bench_driver_capacity``), and a one-process client's CPU shows up in
TTFT. So httpx stays (the seam tests inject, request building, decoding) and only the wire is
replaced. At most ``max_connections`` are open, idle and busy together. A connection returns to
the pool only once its body was read to the end (chunked, Content-Length; a body ended by EOF
closes it) and neither side sent ``Connection: close``; a response closed early closes its
connection, so no read ever starts inside another response's body. Failures raise httpx's
exceptions (``ConnectError``, ``ReadError``, ``RemoteProtocolError`` for a peer that hangs up
mid-message, the timeouts...; ``tuner.http1``), which ``tuner.sse.send`` records as it does
httpcore's. No HTTP/2, proxies or client certificates.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from functools import partial

import httpx

from tuner.http1 import Body, Step, framing, read_head, write_request

__all__ = ["StreamTransport"]
Key = tuple[str, str, int]


@dataclass
class _Connection:
    key: Key
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0


class StreamTransport(httpx.AsyncBaseTransport):
    """HTTP/1.1 keep-alive pool of at most ``max_connections``; see the module docstring."""

    def __init__(self, max_connections: int, keepalive_expiry_s: float = 4.0) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self._limit = max_connections
        # below uvicorn's 5 s keep-alive timeout, so a reused connection is never one the server is closing
        self._expiry = keepalive_expiry_s
        self._slots = asyncio.Semaphore(max_connections)  # held from sending a request to its body's end
        self._idle: dict[Key, list[_Connection]] = {}
        self._open = 0  # idle, busy and connecting: never above the limit
        self._tls: ssl.SSLContext | None = None
        self._closed = False  # after aclose, a connection still busy is closed when its request ends

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeouts = request.extensions.get("timeout", {})
        conn = await self._acquire(request.url, timeouts)
        try:
            async with Step(timeouts.get("write"), httpx.WriteTimeout, httpx.WriteError):
                await write_request(conn.writer, request)
            async with Step(timeouts.get("read"), httpx.ReadTimeout, httpx.ReadError):
                version, status, reason, headers = await read_head(conn.reader)
            fields = {name.lower(): value for name, value in headers}
            chunked, length = framing(request.method, status, fields)
        except BaseException:  # cancelled too: a connection in an unknown state is never reused
            self.release(conn, reuse=False)
            raise
        asked = request.headers.get("connection", "").lower()
        closes = b"close" in fields.get(b"connection", b"").lower() or "close" in asked
        reusable = version == b"HTTP/1.1" and not closes and (chunked or length is not None)
        body = Body(conn.reader, partial(self.release, conn), chunked, length, reusable, timeouts.get("read"))
        return httpx.Response(
            status, headers=headers, stream=body, extensions={"http_version": version, "reason_phrase": reason}
        )

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.writer.close()
                self._open -= 1
        self._idle.clear()

    async def _acquire(self, url: httpx.URL, timeouts: dict[str, float | None]) -> _Connection:
        async with Step(timeouts.get("pool"), httpx.PoolTimeout, httpx.ConnectError):
            await self._slots.acquire()
        key = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        try:
            return self._reuse(key) or await self._connect(key, timeouts.get("connect"))
        except BaseException:
            self._slots.release()
            raise

    def _reuse(self, key: Key) -> _Connection | None:
        idle, now = self._idle.get(key, []), time.monotonic()
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to have expired
            if not conn.reader.at_eof() and not conn.writer.is_closing() and now - conn.idle_since < self._expiry:
                return conn
            conn.writer.close()
            self._open -= 1
        return None

    async def _connect(self, key: Key, timeout: float | None) -> _Connection:
        scheme, host, port = key
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
        if self._open >= self._limit:  # the slot we hold is free only as an idle connection to another host
            victim = next(conns for conns in self._idle.values() if conns).pop(0)
            victim.writer.close()
            self._open -= 1
        if scheme == "https" and self._tls is None:
            self._tls = httpx.create_ssl_context()
        self._open += 1  # counted before the await, so concurrent connects cannot overshoot the limit
        try:
            async with Step(timeout, httpx.ConnectTimeout, httpx.ConnectError):
                reader, writer = await asyncio.open_connection(host, port, ssl=self._tls if scheme == "https" else None)
        except BaseException:
            self._open -= 1
            raise
        return _Connection(key, reader, writer)

    def release(self, conn: _Connection, reuse: bool) -> None:
        """End a request's hold on ``conn``: back to the pool when ``reuse``, else closed."""
        if reuse and not self._closed:
            conn.idle_since = time.monotonic()
            self._idle.setdefault(conn.key, []).append(conn)
        else:
            conn.writer.close()
            self._open -= 1
        self._slots.release()
