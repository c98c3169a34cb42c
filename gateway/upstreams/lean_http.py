"""A lean HTTP/1.1 transport under the gateway's upstream httpx2 client (issue 17).

Profiled under load, httpx2's own transport (httpcore2's pool, h11, anyio streams) was most
of the upstream side of a proxied call's CPU. `LeanTransport` replaces only that layer: it is
an `httpx2.AsyncBaseTransport` over asyncio streams, so httpx2's `AsyncClient` still builds
the requests, runs `Auth` flows (OAuth's included) and event hooks and carries the timeouts.
It keeps a pool of idle keep-alive connections per origin (closed after `KEEPALIVE_EXPIRY`
idle seconds, or when the server closed them), writes a request's head and a known-length
body in one `write`, and reads a response body by Content-Length, chunked, or to EOF,
streaming it (an SSE response) chunk by chunk; a body its reader is done with before its end (an
SSE answer once its event is in) is finished in the background, so that its connection is kept.
`bench/load.py` and `bench/interleaved_cpu.py` measure it (docs/benchmarks.md, "What the gateway
adds to a call").

What it does not do, so `gateway.upstreams.transports` does not use it then: proxies (a
proxy from the environment for the upstream's URL keeps httpx2's own transport), HTTP/2.
There is no cap on connections per origin: an upstream's `max_concurrent_calls` caps the
requests in flight, and so the connections.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx2

from gateway.lazy_timers import LazyDeadline

__all__ = ["Body", "LeanTransport", "Origin"]

KEEPALIVE_EXPIRY = 4.0
"""Seconds an idle connection is kept: under uvicorn's 5 s keep-alive, so that the gateway
drops a connection before a server does, not while sending on it."""
REPLAYABLE = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods sent again on a new connection when a kept-alive one turns out closed before any
byte of the answer. Not POST: the server may have run the tool call before it closed."""
READ_SIZE = 65536
MAX_HEAD = 65536
FINISH_SECONDS = 1.0
FINISH_BYTES = 65536
"""What is read of an answer's rest after the caller has what it wanted (`Body.finish_later`):
an SSE answer's stream normally ends right after the answer's event."""


class _Conn:
    """One connection, with its reads' timeout: one timer moved lazily (`read`)."""

    __slots__ = ("reader", "writer", "idle_since", "reused", "_loop", "_deadline", "_reading", "_expired")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0
        self.reused = False
        self._loop = asyncio.get_running_loop()
        self._deadline = LazyDeadline(self._loop, self._expire)
        self._reading: asyncio.Task[Any] | None = None
        self._expired = False

    async def read(self, timeout: float | None, fn: Callable[..., Awaitable[bytes]], *args: Any) -> bytes:
        """`await fn(*args)`, a read of this connection's; TimeoutError after `timeout` seconds.

        What `asyncio.timeout` does, without a timer (and a Timeout, and the task looked up) per
        read: the read's deadline is noted (`LazyDeadline`), and when it is reached the read is
        cancelled, as `asyncio.timeout` cancels it. With one timeout for every read, that is one
        timer per `timeout` seconds, not one per read."""
        if timeout is None:
            return await fn(*args)
        task = asyncio.current_task(self._loop)
        assert task is not None
        self._deadline.set(self._loop.time() + timeout)
        cancelling = task.cancelling()
        self._reading = task
        try:
            return await fn(*args)
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                if task.uncancel() <= cancelling:
                    raise TimeoutError from None
            raise
        finally:
            self._reading = None
            self._deadline.clear()

    def _expire(self) -> None:
        task = self._reading
        if task is not None:
            self._expired = True
            task.cancel()

    def usable(self, now: float) -> bool:
        return (
            now - self.idle_since < KEEPALIVE_EXPIRY
            and not self.reader.at_eof()
            and not self.writer.transport.is_closing()
        )

    def close(self, abort: bool = False) -> None:
        """Close the socket; `abort` drops what is unsent too (a body read half-way leaves the
        connection in no state to reuse or to wait for)."""
        self._deadline.close()
        if abort:
            self.writer.transport.abort()
        else:
            self.writer.close()


Origin = tuple[str, str, int]
Writer = Callable[[asyncio.StreamWriter], Awaitable[None]]
"""Sends one request on a connection (`LeanTransport.round_trip`)."""


class Body(httpx2.AsyncByteStream):
    """A response body read from one connection; gives the connection back when read to its end.

    Read chunk by chunk (`next_chunk`, or as httpx2's byte stream), each read under the read
    timeout. `finish_later`: the caller has what it wanted (an SSE answer's event), the rest (the
    stream's end, normally already on its way) is read in the background so that the connection
    is kept rather than dropped."""

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
        self.length = length
        """The Content-Length; None when chunked or read to EOF."""
        self._left = length or 0
        self._chunked = chunked
        self._keep = keep
        self._timeout = read_timeout
        self._finishing = False

    async def _read(self, conn: _Conn, fn: Any, *args: Any) -> bytes:
        try:
            return await conn.read(self._timeout, fn, *args)
        except TimeoutError as exc:
            raise httpx2.ReadTimeout(f"timed out reading the response body from {_where(self._origin)}") from exc
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise httpx2.RemoteProtocolError(f"{_where(self._origin)} closed the connection mid-body: {exc!r}") from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx2.RemoteProtocolError(f"{_where(self._origin)} sent a chunk-size line over 64 KiB") from exc

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body (never empty); None once it is all read (the connection
        is given back then)."""
        conn = self._conn
        if conn is None:
            return None
        reader = conn.reader
        if self._chunked:
            line = await self._read(conn, reader.readuntil, b"\r\n")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx2.RemoteProtocolError(
                    f"{_where(self._origin)} sent a malformed chunk size: {line[:40]!r}"
                ) from None
            if size == 0:
                while (await self._read(conn, reader.readuntil, b"\r\n")) != b"\r\n":
                    pass  # trailers
                self._done()
                return None
            data = await self._read(conn, reader.readexactly, size + 2)
            if data[-2:] != b"\r\n":
                raise httpx2.RemoteProtocolError(f"{_where(self._origin)} sent a chunk longer than its size")
            return data[:-2]
        if self.length is not None:
            if self._left <= 0:
                self._done()
                return None
            data = await self._read(conn, reader.read, min(self._left, READ_SIZE))
            if not data:
                raise httpx2.RemoteProtocolError(f"{_where(self._origin)} closed the connection before the whole body")
            self._left -= len(data)
            if self._left <= 0:
                self._done()
            return data
        self._keep = False
        data = await self._read(conn, reader.read, READ_SIZE)
        if not data:
            self._done()
            return None
        return data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (data := await self.next_chunk()) is not None:
            yield data

    def _done(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._keep:
            self._pool._release(self._origin, conn)
        else:
            conn.close()

    async def aclose(self) -> None:
        if not self._finishing:  # else the rest is being read (`finish_later`), which closes it
            self._abort()

    def _abort(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:  # not read to its end: the connection's state is unknown
            conn.close(abort=True)

    def finish_later(self) -> None:
        """Read the rest of the body in the background, unseen, and keep the connection if it
        ends within `FINISH_SECONDS` and `FINISH_BYTES`; drop the connection otherwise."""
        if self._conn is None or self._finishing:
            return
        if not self._keep:
            self._abort()
            return
        self._finishing = True
        self._pool._finish(self)

    async def _finish(self) -> None:
        try:
            async with asyncio.timeout(FINISH_SECONDS):
                left = FINISH_BYTES
                while left > 0 and (data := await self.next_chunk()) is not None:
                    left -= len(data)
        except (TimeoutError, httpx2.TransportError):
            pass
        finally:
            self._abort()  # not ended in time (or not at all): dropped; ended: a no-op


class LeanTransport(httpx2.AsyncBaseTransport):
    """HTTP/1.1 over asyncio streams, a keep-alive pool per origin."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None) -> None:
        self._idle: dict[Origin, list[_Conn]] = {}
        self._ssl = ssl_context
        self._closed = False
        self._finishing: set[asyncio.Task[None]] = set()

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx2.create_ssl_context()
        return self._ssl

    def _release(self, origin: Origin, conn: _Conn) -> None:
        if self._closed:
            conn.close()
            return
        now = time.monotonic()
        conn.idle_since = now
        conn.reused = True
        idle = self._idle.setdefault(origin, [])
        while idle and not idle[0].usable(now):  # the oldest first: idle close without a timer
            idle.pop(0).close()
        idle.append(conn)

    def _finish(self, body: Body) -> None:
        task = asyncio.get_running_loop().create_task(body._finish())
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

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
        try:
            body: bytes | None = request.content
        except httpx2.RequestNotRead:
            body = None
        chunked = body is None and "content-length" not in request.headers
        head = self._head(request, chunked)

        async def write(writer: asyncio.StreamWriter) -> None:
            await _send(writer, head, body, request, chunked)

        target = url.raw_path.decode("ascii", "replace")
        status, reason, headers, stream = await self.round_trip(
            origin, request.method, target, write, request.extensions.get("timeout", {})
        )
        return httpx2.Response(
            status,
            headers=headers,
            stream=stream,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )

    async def round_trip(
        self, origin: Origin, method: str, target: str, write: Writer | bytes, timeouts: dict[str, Any]
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], Body]:
        """One request on a kept-alive connection of `origin` (or a new one): `write` sends it (or
        is the whole request), the answer's status, reason, headers and body stream come back.
        What `handle_async_request` does under httpx2, and `gateway.upstreams.lean_post` without it."""
        conn = self._acquire_idle(origin)
        if conn is not None:
            try:
                return await self._exchange(method, origin, conn, write, timeouts)
            except _Stale as exc:
                if method not in REPLAYABLE:
                    raise httpx2.RemoteProtocolError(
                        f"{origin[1]}:{origin[2]} closed a kept-alive connection without answering {method} {target}"
                    ) from exc
        conn = await self._connect(origin, timeouts.get("connect"))
        try:
            return await self._exchange(method, origin, conn, write, timeouts)
        except _Stale as exc:
            raise httpx2.RemoteProtocolError(
                f"{origin[1]}:{origin[2]} closed the connection without answering {method}"
            ) from exc

    @staticmethod
    def _head(request: httpx2.Request, chunked: bool) -> bytes:
        """The request line and headers (httpx2 has set Host, Content-Length and the rest)."""
        target = request.url.raw_path
        lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
        lines += [name + b": " + value for name, value in request.headers.raw]
        if chunked and "transfer-encoding" not in request.headers:
            lines.append(b"Transfer-Encoding: chunked")
        return b"\r\n".join(lines) + b"\r\n\r\n"

    async def _exchange(
        self, method: str, origin: Origin, conn: _Conn, write: Writer | bytes, timeouts: dict[str, Any]
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], Body]:
        writer, reader = conn.writer, conn.reader
        try:
            try:
                if isinstance(write, bytes):
                    writer.write(write)
                    if writer.transport.get_write_buffer_size():  # not all taken by the socket: wait for it
                        async with asyncio.timeout(timeouts.get("write")):
                            await writer.drain()
                else:
                    async with asyncio.timeout(timeouts.get("write")):
                        await write(writer)
            except TimeoutError as exc:
                raise httpx2.WriteTimeout(f"timed out sending to {origin[1]}:{origin[2]}") from exc
            read_timeout = timeouts.get("read")
            try:
                while True:  # an informational answer (103 Early Hints...) comes before the real one
                    raw = await conn.read(read_timeout, reader.readuntil, b"\r\n\r\n")
                    status, reason, headers, length, chunked, keep = _parse_head(raw, method, origin)
                    if not 100 <= status < 200 or status == 101:
                        break
            except TimeoutError as exc:
                raise httpx2.ReadTimeout(f"timed out waiting for {origin[1]}:{origin[2]} to answer") from exc
            except asyncio.LimitOverrunError as exc:
                raise httpx2.RemoteProtocolError(f"{origin[1]}:{origin[2]} sent a response head over 64 KiB") from exc
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            conn.close(abort=True)
            if conn.reused and not getattr(exc, "partial", b""):
                raise _Stale from exc
            raise httpx2.RemoteProtocolError(f"{origin[1]}:{origin[2]} closed the connection: {exc!r}") from exc
        except BaseException:
            conn.close(abort=True)
            raise
        stream = Body(self, origin, conn, length, chunked, keep, timeouts.get("read"))
        if length == 0 and not chunked:
            stream._done()
        return status, reason, headers, stream

    async def aclose(self) -> None:
        self._closed = True
        for task in list(self._finishing):
            task.cancel()
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


async def _send(
    writer: asyncio.StreamWriter, head: bytes, body: bytes | None, request: httpx2.Request, chunked: bool
) -> None:
    """The head and a known-length body in one write (one segment for a small request); a
    streamed body as it comes, chunked unless its length was given."""
    if body is not None:
        writer.write(head + body)
    else:
        writer.write(head)
        async for chunk in request.stream:  # type: ignore[union-attr]
            if chunk:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await writer.drain()
        if chunked:
            writer.write(b"0\r\n\r\n")
    await writer.drain()


class _Stale(Exception):
    """A reused connection closed before any byte of the response."""


def _where(origin: Origin) -> str:
    return f"{origin[1]}:{origin[2]}"


def _parse_head(
    raw: bytes, method: str, origin: Origin
) -> tuple[int, bytes, list[tuple[bytes, bytes]], int | None, bool, bool]:
    """(status, reason, headers, content length, chunked, keep-alive) of a response head."""
    lines = raw[:-4].split(b"\r\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise httpx2.RemoteProtocolError(f"{_where(origin)} sent no HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(code)
    headers: list[tuple[bytes, bytes]] = []
    length: int | None = None
    chunked = False
    keep = version == b"HTTP/1.1"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise httpx2.RemoteProtocolError(f"{_where(origin)} sent a malformed header: {line[:80]!r}")
        name = name.strip()
        value = value.strip()
        headers.append((name, value))
        lower = name.lower()
        if lower == b"content-length":
            if not value.isdigit():
                raise httpx2.RemoteProtocolError(f"{_where(origin)} sent Content-Length {value[:40]!r}")
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
