"""An httpx transport on plain asyncio streams (HTTP/1.1 only): the wire under the driver's own client.

httpcore, httpx's default wire, was the driver's largest CPU cost per streamed request, several
times what a whole request through the driver costs on this transport, and more at high
concurrency (reports/measurement.md, ``driver_capacity``), and a one-process client's CPU shows up in
TTFT. So httpx stays (the seam tests inject, request building, decoding) and only the wire is
replaced. At most ``max_connections`` are open, idle and busy together. A connection returns to
the pool only once its body was read to the end (chunked, Content-Length; a body ended by EOF
closes it) and neither side sent ``Connection: close``; a response closed early closes its
connection, so no read ever starts inside another response's body. Failures raise httpx's
exceptions (``ConnectError``, ``ReadError``, ``RemoteProtocolError`` for a peer that hangs up
mid-message, the timeouts...; ``tuner.client.transport``), which ``tuner.client.sse.send`` records as it does
httpcore's. No HTTP/2, proxies or client certificates.

HTTP/1.1 on asyncio streams: writing a request, reading a response's head, framing and body.

``tuner.client.transport`` pools connections over these. Every I/O step runs under httpx's timeout for
it (``Step``), and the asyncio and OS errors it meets are raised as httpx's own exceptions, which
``tuner.client.sse.send`` records as it does httpcore's.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import httpx

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


# HTTP/1.1 on the wire: request heads, response heads, body framing.
READ_SIZE = 65536


class Step:
    """One I/O step under httpx's timeout for it, its asyncio and OS errors raised as httpx's own."""

    def __init__(self, seconds: float | None, timeout: type[httpx.TimeoutException], failure: type[Exception]) -> None:
        self._deadline, self._timeout, self._failure = asyncio.timeout(seconds), timeout, failure

    async def __aenter__(self) -> None:
        await self._deadline.__aenter__()

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        try:
            await self._deadline.__aexit__(kind, exc, tb)
        except TimeoutError as expired:  # our deadline, not a caller's cancel (that passes through)
            raise self._timeout("timed out") from expired
        if isinstance(exc, TimeoutError):  # checked before OSError, of which it is a subclass
            raise self._timeout(str(exc) or "timed out") from exc
        if isinstance(exc, asyncio.IncompleteReadError | asyncio.LimitOverrunError | ValueError):
            raise httpx.RemoteProtocolError(f"peer closed or broke the HTTP/1.1 message: {exc!r}") from exc
        if isinstance(exc, OSError):
            raise self._failure(str(exc) or type(exc).__name__) from exc


class Body(httpx.AsyncByteStream):
    """One response body; ``release(reuse)`` is called once: reuse True at its end, False if abandoned."""

    def __init__(
        self, reader: asyncio.StreamReader, release: Callable[[bool], None], chunked: bool, length: int | None,
        reusable: bool, timeout: float | None,
    ) -> None:  # fmt: skip
        self._reader, self._on_end, self._chunked, self._left = reader, release, chunked, length
        self._reusable, self._timeout, self._done, self._released = reusable, timeout, length == 0, False
        if self._done:
            self._release(reuse=reusable)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while not self._done:
            async with Step(self._timeout, httpx.ReadTimeout, httpx.ReadError):
                part = await (self._next_chunk() if self._chunked else self._next_bytes())
            if self._done:
                self._release(reuse=self._reusable)  # before the last yield: the consumer may stop there
            if part:
                yield part

    async def aclose(self) -> None:
        self._release(reuse=False)  # no-op when the body ended; otherwise its rest is still on the wire

    def _release(self, reuse: bool) -> None:
        if not self._released:
            self._released = True
            self._on_end(reuse)

    async def _next_chunk(self) -> bytes:
        reader = self._reader
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)  # extensions after ';' are ignored
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # trailer fields: nothing here reads them
            self._done = True
            return b""
        data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise httpx.RemoteProtocolError("chunk not followed by CRLF")
        return data[:-2]

    async def _next_bytes(self) -> bytes:
        part = await self._reader.read(READ_SIZE if self._left is None else min(self._left, READ_SIZE))
        if self._left is None:  # framed by EOF: the end of the body is the end of the connection
            self._done = not part
            return part
        if not part:
            raise httpx.RemoteProtocolError(f"peer closed the connection with {self._left} body bytes unread")
        self._left -= len(part)
        self._done = self._left == 0
        return part


async def write_request(writer: asyncio.StreamWriter, request: httpx.Request) -> None:
    lines = [b"%s %s HTTP/1.1" % (request.method.encode(), request.url.raw_path)]
    lines += [b"%s: %s" % (name, value) for name, value in request.headers.raw]
    body = await request.aread()  # json= and content= are read already; a streamed body is read whole
    if request.headers.get("transfer-encoding") == "chunked":  # httpx's framing for a body of unknown length
        body = (b"%x\r\n%s\r\n" % (len(body), body) if body else b"") + b"0\r\n\r\n"
    writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)  # one write: one syscall, one segment
    await writer.drain()


async def read_head(reader: asyncio.StreamReader) -> tuple[bytes, int, bytes, list[tuple[bytes, bytes]]]:
    """Status line and headers of the final response; 1xx interim responses are skipped."""
    while True:
        status_line, *lines = (await reader.readuntil(b"\r\n\r\n"))[:-4].split(b"\r\n")
        version, _, rest = status_line.partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise httpx.RemoteProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        if not 100 <= int(code) < 200 or code == b"101":
            break
    headers = [(name.strip(), value.strip()) for name, _, value in (line.partition(b":") for line in lines)]
    return version, int(code), reason, headers


def framing(method: str, status: int, fields: dict[bytes, bytes]) -> tuple[bool, int | None]:
    """(chunked, length): how the body ends; a length of None means at EOF."""
    if method == "HEAD" or status in (204, 304):
        return False, 0
    if b"chunked" in fields.get(b"transfer-encoding", b"").lower():
        return True, None
    length = fields.get(b"content-length")
    if length is None:
        return False, None
    if not length.isdigit():
        raise httpx.RemoteProtocolError(f"bad Content-Length {length[:40]!r}")
    return False, int(length)
