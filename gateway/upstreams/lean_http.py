"""PROTOTYPE (issue 17, measured, not adopted unless it wins): a lean HTTP/1.1 transport for httpx2.

`LeanTransport` is an `httpx2.AsyncBaseTransport` over asyncio streams, for the gateway's
upstream client: httpx2's `AsyncClient` still builds the requests, runs `Auth` flows and event
hooks and applies timeouts, and only the layer under it (httpcore2's pool, h11, anyio streams)
is replaced by a keep-alive pool per origin and a few lines of HTTP/1.1 framing. The request
head and a known-length body go out in one `write`; a response body is read by Content-Length,
chunked, or to EOF, and streamed (SSE) chunk by chunk.

What it does not do (so it must stay off where these matter): proxies, HTTP/2, a cap on the
number of connections per origin, `Expect: 100-continue`.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx2

__all__ = ["LeanTransport"]

KEEPALIVE_EXPIRY = 5.0
"""Seconds an idle connection is kept (httpcore's default)."""
READ_SIZE = 65536
MAX_HEAD = 65536


class _Conn:
    __slots__ = ("reader", "writer", "idle_since", "reused")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.reused = False

    def usable(self, now: float) -> bool:
        return (
            now - self.idle_since < KEEPALIVE_EXPIRY
            and not self.reader.at_eof()
            and not self.writer.transport.is_closing()
        )

    def close(self) -> None:
        self.writer.transport.abort() if self.reader.at_eof() else self.writer.close()


Origin = tuple[str, str, int]


class _Body(httpx2.AsyncByteStream):
    """A response body read from one connection; gives the connection back when read to its end."""

    def __init__(
        self,
        pool: LeanTransport,
        origin: Origin,
        conn: _Conn,
        length: int | None,
        chunked: bool,
        keep: bool,
        read_timeout: float | None,
    ) -> None:
        self._pool = pool
        self._origin = origin
        self._conn: _Conn | None = conn
        self._length = length
        self._chunked = chunked
        self._keep = keep
        self._timeout = read_timeout

    async def _read(self, fn: Any, *args: Any) -> bytes:
        try:
            async with asyncio.timeout(self._timeout):
                data: bytes = await fn(*args)
                return data
        except TimeoutError as exc:
            raise httpx2.ReadTimeout("timed out reading the response body") from exc
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError) as exc:
            raise httpx2.RemoteProtocolError(f"the server closed the connection mid-body: {exc!r}") from exc

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        if conn is None:
            return
        reader = conn.reader
        if self._chunked:
            while True:
                line = await self._read(reader.readuntil, b"\r\n")
                size = int(line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await self._read(reader.readuntil, b"\r\n")) != b"\r\n":
                        pass  # trailers
                    break
                data = await self._read(reader.readexactly, size + 2)
                yield data[:-2]
        elif self._length is not None:
            left = self._length
            while left > 0:
                data = await self._read(reader.read, min(left, READ_SIZE))
                if not data:
                    raise httpx2.RemoteProtocolError("the server closed the connection before the whole body")
                left -= len(data)
                yield data
        else:
            self._keep = False
            while data := await self._read(reader.read, READ_SIZE):
                yield data
        self._done()

    def _done(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep:
            self._pool._release(self._origin, conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:  # not read to its end: the connection's state is unknown
            conn.close()


class LeanTransport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 over asyncio streams, a keep-alive pool per origin."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: dict[Origin, list[_Conn]] = {}
        self._ssl = ssl_context
        self._closed = False

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx2.create_ssl_context()
        return self._ssl

    def _release(self, origin: Origin, conn: _Conn) -> None:
        if self._closed:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        conn.reused = True
        self._idle.setdefault(origin, []).append(conn)

    async def _connect(self, origin: Origin, timeout: float | None) -> _Conn:
        scheme, host, port = origin
        try:
            async with asyncio.timeout(timeout):
                if scheme == "https":
                    reader, writer = await asyncio.open_connection(
                        host, port, ssl=self._ssl_context(), server_hostname=host, limit=MAX_HEAD
                    )
                else:
                    reader, writer = await asyncio.open_connection(host, port, limit=MAX_HEAD)
        except TimeoutError as exc:
            raise httpx2.ConnectTimeout(f"connecting to {host}:{port} timed out") from exc
        except OSError as exc:
            raise httpx2.ConnectError(f"cannot connect to {host}:{port}: {exc}") from exc
        return _Conn(reader, writer)

    def _acquire_idle(self, origin: Origin) -> _Conn | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if conn.usable(now):
                return conn
            conn.close()
        return None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx2.UnsupportedProtocol(f"the lean transport speaks http and https, not {scheme!r}")
        origin: Origin = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        timeouts = request.extensions.get("timeout", {})
        try:
            body: bytes | None = request.content
        except httpx2.RequestNotRead:
            body = None
        head = self._head(request, chunked=body is None)
        conn = self._acquire_idle(origin)
        if conn is not None:
            try:
                return await self._exchange(request, origin, conn, head, body, timeouts)
            except _Stale:
                pass  # the server closed a kept-alive connection before answering: once more, on a new one
        conn = await self._connect(origin, timeouts.get("connect"))
        try:
            return await self._exchange(request, origin, conn, head, body, timeouts)
        except _Stale as exc:
            raise httpx2.RemoteProtocolError("the server closed the connection without a response") from exc

    @staticmethod
    def _head(request: httpx2.Request, chunked: bool) -> bytes:
        target = request.url.raw_path
        lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
        lines += [name + b": " + value for name, value in request.headers.raw]
        if chunked and "transfer-encoding" not in request.headers:
            lines.append(b"Transfer-Encoding: chunked")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _exchange(
        self,
        request: httpx2.Request,
        origin: Origin,
        conn: _Conn,
        head: bytes,
        body: bytes | None,
        timeouts: dict[str, Any],
    ) -> httpx2.Response:
        writer, reader = conn.writer, conn.reader
        try:
            async with asyncio.timeout(timeouts.get("write")):
                if body is not None:
                    writer.write(head + body if len(body) < READ_SIZE else head)
                    if len(body) >= READ_SIZE:
                        writer.write(body)
                else:
                    writer.write(head)
                    async for chunk in request.stream:  # type: ignore[union-attr]
                        if chunk:
                            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                            await writer.drain()
                    writer.write(b"0\r\n\r\n")
                await writer.drain()
            async with asyncio.timeout(timeouts.get("read")):
                raw = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError as exc:
            conn.close()
            raise httpx2.ReadTimeout("timed out waiting for the response") from exc
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            conn.close()
            if conn.reused and not getattr(exc, "partial", b""):
                raise _Stale from exc
            raise httpx2.RemoteProtocolError(f"the server closed the connection: {exc!r}") from exc
        except asyncio.LimitOverrunError as exc:
            conn.close()
            raise httpx2.RemoteProtocolError("the response head is too large") from exc
        status, reason, headers, length, chunked, keep = _parse_head(raw, request.method)
        stream = _Body(self, origin, conn, length, chunked, keep, timeouts.get("read"))
        if length == 0 and not chunked:
            stream._done()
        return httpx2.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def aclose(self) -> None:
        self._closed = True
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


class _Stale(Exception):
    """A reused connection closed before any byte of the response."""


def _parse_head(raw: bytes, method: str) -> tuple[int, bytes, list[tuple[bytes, bytes]], int | None, bool, bool]:
    """(status, reason, headers, content length, chunked, keep-alive) of a response head."""
    lines = raw[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3:
        raise httpx2.RemoteProtocolError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(code)
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    keep = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx2.RemoteProtocolError(f"malformed response header: {line[:80]!r}")
        name = name.strip()
        value = value.strip()
        headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length":
            length = int(value)
        elif lower == b"transfer-encoding":
            chunked = value.lower().endswith(b"chunked")
        elif lower == b"connection":
            keep = value.lower() != b"close" if keep else value.lower() == b"keep-alive"
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        length, chunked = 0, False
    elif chunked:
        length = None
    return status, reason, headers, length, chunked, keep
