"""A JSON body for a quick request on the 2025-era streamable-HTTP path, an SSE stream for the rest.

The SDK's 2025-era transport (handshake, `Mcp-Session-Id`) answers every POSTed request with a
`text/event-stream`, which costs the gateway about a fifth of its CPU per proxied call; its
`json_response=True` mode avoids that but drops every message related to the request (progress,
log lines, an elicitation relayed from an upstream). The SDK's 2026-07-28 path already defers the
choice (`mcp.server._streamable_http_modern.handle_modern_request`): wait for the first thing the
handler emits; if that is the answer, `application/json`; if a notification or request came first,
or nothing came within the window, `text/event-stream` with what came, pings, and the answer.
Every conformant client accepts either for a POST (spec, streamable HTTP, "Sending messages to
the server").

`DeferringTransport` does the same on the 2025-era path, for every JSON-RPC request (`initialize`
included: the rule is the same, and a client that opens a session per task saves the stream too).
Everything else goes to the SDK's own code unchanged: notifications and responses (202), GET,
DELETE, an event store (resumability: its priming events make the stream the record), a client
that does not accept both content types (the SDK answers 406), and any body the SDK refuses.
`response_mode: sse` (`json_first=False`) streams at once, as the SDK's transport does.

A client that hangs up before its answer has its request cancelled in the session (`_cancel`):
without an event store its answer could go to nobody (docs/settings.md, "Hung-up clients").

All reach into the SDK's private layout is here, mirroring mcp 2.3 (`pyproject.toml` pins
`mcp>=2.3,<2.4`; `tests/test_http_responses.py` fails when the mirrored SDK code changes):
- `StreamableHTTPServerTransport._handle_post_request`: its SSE branch, with the choice deferred;
  it reuses the transport's own helpers (`_check_content_type`, `_create_session_message`,
  `_run_sse_writer`, `_create_event_data`, `_create_json_response`, `_create_error_response`,
  `_clean_up_memory_streams`) and state
  (`_request_streams`, `_sse_stream_writers`, `_read_stream_writer`, `_event_store`).
- `StreamableHTTPSessionManager._admit_session` and `._handle_stateless_request`: copied, to make
  this transport instead of the SDK's.
- `Server.streamable_http_app`: the part the gateway uses (no SDK auth), with this manager.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from contextvars import ContextVar
from http import HTTPStatus
from typing import Any
from uuid import uuid4

import anyio
import pydantic_core
from anyio.abc import TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.connection import Connection
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_connection
from mcp.server.streamable_http import (
    MCP_SESSION_ID_HEADER,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    SSEEvent,
    StreamableHTTPServerTransport,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.jsonrpc_dispatcher import JSONRPCDispatcher
from mcp.shared.message import SessionMessage
from mcp.shared.transport_context import TransportContext
from mcp_types import (
    DEFAULT_NEGOTIATED_VERSION,
    INTERNAL_ERROR,
    JSONRPCError,
    JSONRPCNotification,
    JSONRPCRequest,
    JSONRPCResponse,
    jsonrpc_message_adapter,
)
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

__all__ = ["DeferringSessionManager", "DeferringTransport", "deferring_http_app"]

logger = logging.getLogger(__name__)

HUNG_UP = "The client disconnected before the answer"
"""The reason of the `notifications/cancelled` a hung-up client's request is cancelled with."""
CANCEL_SECONDS = 5.0
"""Most seconds spent handing that cancellation to the session (shielded: the request's own task is ending)."""

_PING: SSEEvent = {"comment": "ping"}
"""Opens a stream committed because the window elapsed: the client has bytes at once, as on the
SDK's 2026-07-28 path."""


class DeferringTransport(StreamableHTTPServerTransport):
    """The SDK's 2025-era transport, with a POSTed request answered by JSON when its answer is the
    first thing it has within `window` seconds, else by SSE pinged every `window` seconds; with
    `json_first` False (`response_mode: sse`), by SSE at once, as the SDK answers it."""

    def __init__(self, *args: Any, window: float, json_first: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.window = window
        self.json_first = json_first

    async def _handle_post_request(self, scope: Scope, request: Request, receive: Receive, send: Send) -> None:
        """Mirrors the SDK method's SSE branch; every case it does not cover is the SDK's own."""
        message = await self._deferrable(request)
        if message is None:
            await super()._handle_post_request(scope, request, receive, send)
            return
        writer = self._read_stream_writer
        assert writer is not None  # connect() ran: the manager starts it before serving
        request_id = str(message.id)
        try:
            if message.method == "initialize" and message.params:
                protocol_version = str(message.params.get("protocolVersion", DEFAULT_NEGOTIATED_VERSION))
            else:
                protocol_version = request.headers.get(MCP_PROTOCOL_VERSION_HEADER, DEFAULT_NEGOTIATED_VERSION)
            streams = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
            self._request_streams[request_id] = streams
            await writer.send(self._create_session_message(message, request, request_id, protocol_version))
            await self._answer(message, streams[1], scope, receive, send)
        except Exception as err:  # the SDK method's own boundary, same answer
            logger.exception("Error handling POST request")
            await self._clean_up_memory_streams(request_id)
            response = self._create_error_response(
                "Error handling POST request", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
            )
            await response(scope, receive, send)
            await writer.send(Exception(err))

    async def _deferrable(self, request: Request) -> JSONRPCRequest | None:
        """The request, when its answer may be deferred; None leaves the POST to the SDK, which then
        answers it exactly as before (the body is cached on `request`, so it is read once)."""
        if self.is_json_response_enabled or self._event_store is not None:
            return None
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse and self._check_content_type(request)):
            return None
        try:
            body = await request.body()
        except ClientDisconnect:  # gone mid-body: the SDK method answers it, as it always has
            return None
        try:
            message = jsonrpc_message_adapter.validate_python(pydantic_core.from_json(body), by_name=False)
        except (ValueError, ValidationError):
            return None
        if not isinstance(message, JSONRPCRequest):
            return None
        session_id = request.headers.get(MCP_SESSION_ID_HEADER)
        if message.method == "initialize":
            # The SDK refuses only a session id that is not this session's.
            known = self.mcp_session_id is None or session_id is None or session_id == self.mcp_session_id
            return message if known else None
        return message if self.mcp_session_id is None or session_id == self.mcp_session_id else None

    async def _answer(
        self,
        message: JSONRPCRequest,
        stream: MemoryObjectReceiveStream[EventMessage],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """Wait up to the window for the request's first message, then answer with JSON or SSE.

        A client that hangs up before its answer has the request cancelled (`_cancel`): during the
        window a task watches for it (about 0.1 ms of CPU a call, `bench/load.py`),
        on the stream sse_starlette does. The request's memory stream is released at once then.
        """
        request_id = str(message.id)
        if not self.json_first:
            if not await self._stream(request_id, stream, None, scope, receive, send):
                await self._cancel(message)
            return
        first: EventMessage | None = None
        closed = False
        hung_up = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(_watch_hang_up, receive, hung_up, tg.cancel_scope)
            with anyio.move_on_after(self.window):
                try:
                    first = await stream.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError):
                    closed = True
            tg.cancel_scope.cancel()
        if closed:
            # The session was terminated with the request in flight (the SDK's JSON mode answer).
            await self._clean_up_memory_streams(request_id)
            response = self._create_error_response(
                "Session terminated before the request completed", HTTPStatus.INTERNAL_SERVER_ERROR, INTERNAL_ERROR
            )
            await response(scope, receive, send)
        elif first is not None and isinstance(first.message, JSONRPCResponse | JSONRPCError):
            await self._clean_up_memory_streams(request_id)
            await self._create_json_response(first.message)(scope, receive, send)
        elif hung_up.is_set():
            await self._cancel(message)
        else:
            opening = _PING if first is None else self._create_event_data(first)
            if not await self._stream(request_id, stream, opening, scope, receive, send):
                await self._cancel(message)

    async def _stream(
        self,
        request_id: str,
        stream: MemoryObjectReceiveStream[EventMessage],
        opening: SSEEvent | None,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> bool:
        """The SDK's SSE answer from `opening` on: the rest of the request's messages, then its answer.
        Whether it went out: False when the stream ended before (the client hung up)."""
        sse_writer, sse_reader = anyio.create_memory_object_stream[SSEEvent](0)
        self._sse_stream_writers[request_id] = sse_writer
        headers = {
            "Cache-Control": "no-cache, no-transform",
            "Connection": "keep-alive",
            "Content-Type": "text/event-stream",
            **({MCP_SESSION_ID_HEADER: self.mcp_session_id} if self.mcp_session_id else {}),
        }
        forwarded = False

        async def forward() -> None:  # cancelled by sse_starlette when the client hangs up
            nonlocal forwarded
            await self._run_sse_writer(request_id, sse_writer, stream, opening)
            forwarded = True

        response = EventSourceResponse(
            content=sse_reader, data_sender_callable=forward, headers=headers, ping=self.window
        )
        try:
            await response(scope, receive, send)
        except Exception:
            logger.exception("SSE response error")
            await sse_writer.aclose()
            await self._clean_up_memory_streams(request_id)
        finally:
            await sse_reader.aclose()
        return forwarded

    async def _cancel(self, message: JSONRPCRequest) -> None:
        """Cancel a request whose answer can no longer be delivered, as the client's `notifications/cancelled`
        would: its handler is cancelled, so is the call upstream, and the call is recorded `cancelled`.

        The 2025-era spec says a disconnect SHOULD NOT by itself cancel, so that a client can resume
        the stream; without an event store (those requests are the SDK's: `_deferrable`) no stream
        can be resumed, and the answer would go to nobody (docs/settings.md, "Hung-up clients").
        `initialize` is never cancelled (the spec forbids it); its stream is released all the same."""
        await self._clean_up_memory_streams(str(message.id))
        writer = self._read_stream_writer
        if writer is None or message.method == "initialize":
            return
        params = {"requestId": message.id, "reason": HUNG_UP}
        cancel = JSONRPCNotification(jsonrpc="2.0", method="notifications/cancelled", params=params)
        with (
            anyio.move_on_after(CANCEL_SECONDS, shield=True),
            suppress(anyio.ClosedResourceError, anyio.BrokenResourceError),
        ):
            await writer.send(SessionMessage(cancel))


async def _watch_hang_up(receive: Receive, hung_up: anyio.Event, scope: anyio.CancelScope) -> None:
    """Set `hung_up` and cancel `scope` when the client disconnects. The request's body was read
    (`_deferrable`), so a disconnect is all `receive` can still report."""
    while (await receive())["type"] != "http.disconnect":
        pass
    hung_up.set()
    scope.cancel()


_client_address: ContextVar[str] = ContextVar("mcp_gateway_session_client", default="")
"""The address of the request that may open a session (set around the SDK's stateful handling)."""


class DeferringSessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, making `DeferringTransport`s with a `window` of seconds, and refusing a
    client a new session while it holds `max_sessions_per_client` (by key, or by address without one):
    one key holder could otherwise take every one of `max_sessions` and lock the others out."""

    def __init__(
        self, app: Server[Any], *, window: float, json_first: bool, max_sessions_per_client: int, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self.window = window
        self.json_first = json_first
        self.max_sessions_per_client = max_sessions_per_client
        self._session_addresses: dict[str, str] = {}

    async def _handle_stateful_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get("client")
        token = _client_address.set(str(client[0]) if client else "")
        try:
            await super()._handle_stateful_request(scope, receive, send)
        finally:
            _client_address.reset(token)

    def _holds_too_many(self, requestor: AuthorizationContext | None) -> bool:
        """Whether this client (its key, else its address) holds `max_sessions_per_client` sessions."""
        if requestor is not None:
            held = sum(1 for owner in self._session_owners.values() if owner == requestor)
        else:
            for gone in [sid for sid in self._session_addresses if sid not in self._server_instances]:
                del self._session_addresses[gone]
            address = _client_address.get()
            held = sum(
                1 for sid, a in self._session_addresses.items() if a == address and sid not in self._session_owners
            )
        return held >= self.max_sessions_per_client

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        """Copied from the SDK's method; the transport's class, `window` and the per-client cap differ."""
        if self.max_sessions is not None and len(self._server_instances) >= self.max_sessions:
            return None
        if self._holds_too_many(requestor):
            logger.warning("Refusing a new session: the client holds %d already", self.max_sessions_per_client)
            return None
        http_transport = DeferringTransport(
            mcp_session_id=uuid4().hex,
            is_json_response_enabled=self.json_response,
            event_store=self.event_store,
            security_settings=self.security_settings,
            retry_interval=self.retry_interval,
            idle_timeout=self.session_idle_timeout,
            window=self.window,
            json_first=self.json_first,
        )
        session_id = http_transport.mcp_session_id
        assert session_id is not None
        if requestor is not None:
            self._session_owners[session_id] = requestor
        else:
            self._session_addresses[session_id] = _client_address.get()
        self._server_instances[session_id] = http_transport
        logger.debug("Created new transport with session ID: %s", session_id)
        return http_transport

    async def _handle_stateless_request(
        self, protocol_version_hint: str | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Copied from the SDK's method; only the transport's class and `window` differ."""
        http_transport = DeferringTransport(
            mcp_session_id=None,
            is_json_response_enabled=self.json_response,
            event_store=None,
            security_settings=self.security_settings,
            window=self.window,
            json_first=self.json_first,
        )

        async def run_stateless_server(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
            async with http_transport.connect() as streams:
                read_stream, write_stream = streams
                task_status.started()
                dispatcher: JSONRPCDispatcher[TransportContext] = JSONRPCDispatcher(
                    read_stream,
                    write_stream,
                    inline_methods=frozenset({"initialize"}),
                    transport_builder=lambda _md: TransportContext(kind="streamable-http", can_send_request=False),
                )
                version = protocol_version_hint if protocol_version_hint is not None else DEFAULT_NEGOTIATED_VERSION
                connection = Connection.from_envelope(version, None, None)
                try:
                    await serve_connection(
                        self.app, dispatcher, connection=connection, lifespan_state=self._lifespan_state
                    )
                except Exception:
                    logger.exception("Stateless session crashed")

        assert self._task_group is not None
        try:
            await self._task_group.start(run_stateless_server)
            await http_transport.handle_request(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await http_transport.terminate()


def deferring_http_app(
    server: Server[Any],
    *,
    path: str,
    stateless: bool,
    security: TransportSecuritySettings,
    max_request_body_size: int,
    session_idle_timeout: float,
    max_sessions: int,
    max_sessions_per_client: int,
    routes: list[BaseRoute],
    window: float,
    json_first: bool = True,
) -> Starlette:
    """`Server.streamable_http_app` as the gateway calls it (no SDK auth), with `DeferringSessionManager`.

    The manager is set on the server as the SDK's method sets it, so `server.session_manager` is it."""
    manager = DeferringSessionManager(
        server,
        window=window,
        json_first=json_first,
        max_sessions_per_client=max_sessions_per_client,
        stateless=stateless,
        security_settings=security,
        max_request_body_size=max_request_body_size,
        session_idle_timeout=session_idle_timeout,
        max_sessions=max_sessions,
    )
    server._session_manager = manager
    endpoint = StreamableHTTPASGIApp(manager)
    return Starlette(routes=[Route(path, endpoint=endpoint), *routes], lifespan=lambda app: manager.run())
