"""HTTP/1.1 on asyncio streams: writing a request, reading a response's head, framing and body.

``tuner.transport`` pools connections over these. Every I/O step runs under httpx's timeout for
it (``Step``), and the asyncio and OS errors it meets are raised as httpx's own exceptions, which
``tuner.sse.send`` records as it does httpcore's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

__all__ = ["Body", "Step", "framing", "read_head", "write_request"]
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
