"""The gateway's HTTP/1.1 protocol: uvicorn's httptools protocol with two changes for the hot path.

uvicorn (`uvicorn.Server`) still runs the sockets, TLS, lifespan, graceful shutdown and the
keep-alive, pipelining and flow-control bookkeeping of each connection; this subclass of its
`HttpToolsProtocol` changes what happens to a request once its head is parsed:

- a request `gateway.serving.hot_front.HotFront.takes` goes to the front, past uvicorn's proxy
  headers and the app's outer layers (whose checks the front runs itself); every other request
  goes to the whole ASGI app as before;
- reads land in one buffer of the protocol's (`asyncio.BufferedProtocol`) instead of a fresh
  256 KiB bytes object per read (asyncio's selector transport), then shrunk: with glibc's mmap
  threshold under 256 KiB each of those was an mmap, two page faults and an munmap, about 25 us
  a read here against 3 us for a read into the buffer (`gateway.malloc` now keeps such blocks on
  the heap, which other reads need; the buffer still saves the copy);
- an answer whose length is known (`Content-Length`) leaves in one write, head and body
  together, instead of one write for the head and one for the body: one system call and one
  TCP segment fewer for every such answer. A streamed answer (chunked: SSE) still has its head
  written at once, since the client waits for it.

`on_headers_complete` is uvicorn's own (0.54), with the front's choice and the cycle class
changed; `tests/test_http_server.py` fails when uvicorn's protocol changes under it.
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from gateway.serving.hot_front import HotFront

__all__ = ["HANG_UP_KEY", "front_protocol", "whole_answers"]


class _Holder:
    """Takes the one write of a response's head, to send it with the body."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


HANG_UP_KEY = "mcp_gateway.when_hung_up"
"""In the scope of a request this protocol runs: `when_hung_up(callback)` has `callback` called
(once, synchronously) when the client hangs up before the answer is complete; `when_hung_up(None)`
forgets it. The lean path's way of noticing a hang-up without a task reading `http.disconnect`."""


class _Cycle(RequestResponseCycle):
    """uvicorn's request-response cycle, writing a known-length answer's head with its body."""

    _held: bytes | None = None
    _on_hang_up: Callable[[], None] | None = None

    def when_hung_up(self, callback: Callable[[], None] | None) -> None:
        self._on_hang_up = callback

    def hung_up(self) -> None:
        """The connection is lost before the answer is complete."""
        callback, self._on_hang_up = self._on_hang_up, None
        if callback is not None:
            callback()

    def answer_whole(self, head: bytes, body: bytes) -> bool:
        """A whole 200 answer in one write, past the ASGI messages: `head` is its own header lines
        (each ending CRLF, names lowercase, values valid: the caller's to vouch for), `body` its
        Content-Length body. What `send` makes of a start and a body message, without checking
        the headers again; False (nothing written) where `send` must do it (an answer begun, a
        hang-up, paused writing, an access log), and the caller sends the messages instead."""
        if self.response_started or self.disconnected or self.flow.write_paused or self.access_log:
            return False
        self.response_started = True
        self.waiting_for_100_continue = False
        close = b"" if self.keep_alive else b"connection: close\r\n"
        self.transport.write(b"".join((_OK, _defaults(self.default_headers), head, close, b"\r\n", body)))
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        return True

    async def send(self, message: Any) -> None:
        if not self.response_started and message["type"] == "http.response.start" and not self.disconnected:
            if self.flow.write_paused:
                await self.flow.drain()
            transport, holder = self.transport, _Holder()
            self.transport = holder  # type: ignore[assignment]  # the head's one write
            try:
                await super().send(message)
            finally:
                self.transport = transport
            if self.chunked_encoding is False and self.expected_content_length > 0 and self.scope["method"] != "HEAD":
                self._held = holder.data
            else:
                transport.write(holder.data)
            return
        held = self._held
        if held is None or message["type"] != "http.response.body" or self.disconnected:
            await super().send(message)
            return
        self._held = None
        body = message.get("body", b"")
        if len(body) > self.expected_content_length:
            raise RuntimeError("Response content longer than Content-Length")
        self.expected_content_length -= len(body)
        self.transport.write(held + body)
        if message.get("more_body", False):
            return
        if self.expected_content_length != 0:
            raise RuntimeError("Response content shorter than Content-Length")
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


_OK = STATUS_LINE[200]
_default_lines: tuple[object, bytes] = (None, b"")


def _defaults(headers: list[tuple[bytes, bytes]]) -> bytes:
    """uvicorn's default headers (Date, Server) as header lines: the server replaces the list
    each second (a new Date), so the lines are made once per list."""
    global _default_lines
    if _default_lines[0] is not headers:
        _default_lines = (headers, b"".join(name.lower() + b": " + value + b"\r\n" for name, value in headers))
    return _default_lines[1]


def whole_answers(send: Any) -> Callable[[bytes, bytes], bool] | None:
    """`_Cycle.answer_whole` of the cycle whose own `send` this is (no layer wraps it, so none
    misses the answer); None for any other `send`."""
    cycle = getattr(send, "__self__", None)
    if isinstance(cycle, _Cycle) and getattr(send, "__func__", None) is _Cycle.send:
        return cycle.answer_whole
    return None


_READS = memoryview(bytearray(64 * 1024))
"""Where every connection's reads land: parsed at once (httptools copies what it hands on)."""


def front_protocol(front: HotFront | None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, with `front` (None: none) serving the requests it takes."""

    class FrontProtocol(HttpToolsProtocol, asyncio.BufferedProtocol):
        cycle: _Cycle

        def connection_lost(self, exc: Exception | None) -> None:
            cycle = self.cycle
            super().connection_lost(exc)
            if cycle is not None and cycle.disconnected:
                cycle.hung_up()

        def get_buffer(self, sizehint: int) -> memoryview:
            return _READS

        def buffer_updated(self, nbytes: int) -> None:
            self.data_received(_READS[:nbytes])  # type: ignore[arg-type]  # httptools parses a memoryview

        def on_headers_complete(self) -> None:
            http_version = self.parser.get_http_version()
            method = self.parser.get_method()
            self.scope["method"] = method.decode("ascii")
            if http_version != "1.1":
                self.scope["http_version"] = http_version
            if self.parser.should_upgrade() and self._should_upgrade():
                return
            parsed_url = httptools.parse_url(self.url)
            raw_path = parsed_url.path
            path = raw_path.decode("ascii")
            if "%" in path:
                path = urllib.parse.unquote(path)
            self.scope["path"] = self.root_path + path
            self.scope["raw_path"] = self.root_path.encode("ascii") + raw_path
            self.scope["query_string"] = parsed_url.query or b""
            app: Any
            if self.limit_concurrency is not None and (
                len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency
            ):
                app = service_unavailable
                self.logger.warning("Exceeded concurrency limit.")
            elif front is not None and front.takes(self.scope):  # type: ignore[arg-type]  # uvicorn's TypedDict is a scope
                app = front
            else:
                app = self.app
            existing_cycle = self.cycle
            self.cycle = _Cycle(
                scope=self.scope,
                transport=self.transport,
                flow=self.flow,
                logger=self.logger,
                access_logger=self.access_logger,
                access_log=self.access_log and self.access_logger.isEnabledFor(logging.INFO),  # else unlogged
                default_headers=self.server_state.default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=self.expect_100_continue,
                keep_alive=http_version != "1.0" and self.parser.should_keep_alive(),
                on_response=self.on_response_complete,
            )
            self.scope[HANG_UP_KEY] = self.cycle.when_hung_up  # type: ignore[literal-required]  # our key
            if existing_cycle is None or existing_cycle.response_complete:
                self._start_asgi_task(self.cycle, app)
            else:  # pipelined: queued until the answer before it is complete
                self.flow.pause_reading()
                self.pipeline.appendleft((self.cycle, app))

    return FrontProtocol
