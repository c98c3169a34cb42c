"""The gateway's HTTP/1.1 protocol: uvicorn's httptools protocol with two changes for the hot path.

uvicorn (`uvicorn.Server`) still runs the sockets, TLS, lifespan, graceful shutdown and the
keep-alive, pipelining and flow-control bookkeeping of each connection; this subclass of its
`HttpToolsProtocol` changes what happens to a request once its head is parsed:

- a request `gateway.serving.hot_front.HotFront.takes` goes to the front, past uvicorn's proxy
  headers and the app's outer layers (whose checks the front runs itself); every other request
  goes to the whole ASGI app as before;
- an answer whose length is known (`Content-Length`) leaves in one write, head and body
  together, instead of one write for the head and one for the body: one system call and one
  TCP segment fewer for every such answer. A streamed answer (chunked: SSE) still has its head
  written at once, since the client waits for it.

`on_headers_complete` is uvicorn's own (0.54), with the front's choice and the cycle class
changed; `tests/test_http_server.py` fails when uvicorn's protocol changes under it.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import httptools
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.serving.hot_front import HotFront

__all__ = ["front_protocol"]


class _Holder:
    """Takes the one write of a response's head, to send it with the body."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data


class _Cycle(RequestResponseCycle):
    """uvicorn's request-response cycle, writing a known-length answer's head with its body."""

    _held: bytes | None = None

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


def front_protocol(front: HotFront | None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, with `front` (None: none) serving the requests it takes."""

    class FrontProtocol(HttpToolsProtocol):
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
                access_log=self.access_log,
                default_headers=self.server_state.default_headers,
                message_event=asyncio.Event(),
                expect_100_continue=self.expect_100_continue,
                keep_alive=http_version != "1.0" and self.parser.should_keep_alive(),
                on_response=self.on_response_complete,
            )
            if existing_cycle is None or existing_cycle.response_complete:
                self._start_asgi_task(self.cycle, app)
            else:  # pipelined: queued until the answer before it is complete
                self.flow.pause_reading()
                self.pipeline.appendleft((self.cycle, app))

    return FrontProtocol
