"""The lean path over stdio: the hot requests of a stdio session served beside the SDK's session.

Over stdio the SDK's session takes every line through two memory streams and a relay task
(`serve_dual_era_loop`), validates it into a pydantic message, spawns the handler, builds a
pydantic response and dumps it again. `StdioLean` is offered each line the transport reads
(`gateway.serving.stdio`) and serves it itself when it can do so exactly as the SDK would: a
`tools/call`, `tools/list`, `resources/read` or `prompts/get` request alone on its line, not
task-augmented, not one of the gateway's own tools (`gateway.serving.hot_requests`), parsed once
(orjson), run in a task of the SDK dispatcher's own task group and answered with orjson on the
transport's `Outbox`:

- on a handshake-era connection, once `initialize` has been accepted, with params the SDK accepts
  and no 2026-07-28 envelope: through the server's middleware and the gateway's handler
  (`hot_requests.outcome`);
- on a 2026-07-28 connection, a request with its envelope: through the SDK's own runner
  (`serve_one` on a connection of the envelope's, client requests refused), as
  `_serve_modern_stream` serves it, minus the transport's streams and models.

Everything else goes to the SDK's session unchanged: the handshake, notifications and responses,
batches, bad JSON, params the SDK refuses (so its error is the error). A lean request lives where
the SDK's would: it is entered in the dispatcher's in-flight table, so `notifications/cancelled`
(read by the SDK) cancels it and it is then not answered; its `ServerSession` talks through the
SDK's own per-request channel (`_JSONRPCDispatchContext`), so progress, log lines and requests of
the client (sampling, elicitation, roots) travel and are answered as on the SDK's path; stdin
closing ends the dispatcher's task group, which cancels it, and it is answered `Connection
closed` as the SDK's are. Its answer follows whatever it sent before on the same `Outbox`.

The lean path learns the session's dispatcher (and era) from a request the SDK served on it (the
handshake, or a 2026-07-28 connection's first request), through a server middleware. Reaching into
the SDK (mcp 2.3): `JSONRPCDispatcher._tg`, `_in_flight`, `_write_stream`, `_closed`, `_InFlight`,
`_JSONRPCDispatchContext` and `mcp.server.runner._NoServerRequestsDispatchContext`;
`tests/test_stdio_lean.py` fails when they change.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import anyio
import orjson
from mcp.server.connection import Connection, NotifyOnlyOutbound
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.runner import _NoServerRequestsDispatchContext, modern_error_data, serve_one
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import InboundLadderRejection, classify_inbound_request
from mcp.shared.jsonrpc_dispatcher import (
    JSONRPCDispatcher,
    _InFlight,
    _JSONRPCDispatchContext,
    coerce_request_id,
    handler_exception_to_error_data,
    progress_token_from_params,
)
from mcp.shared.transport_context import TransportContext
from mcp_types import CONNECTION_CLOSED, INTERNAL_ERROR, ErrorData
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError

from gateway.serving.hot_requests import (
    Hot,
    HotFilter,
    compose,
    dump_json,
    hot_request,
    hot_shape,
    is_enveloped,
    outcome,
    request_context,
)
from gateway.serving.stdio import Outbox

__all__ = ["StdioLean"]

logger = logging.getLogger(__name__)

SHUTDOWN_WRITE_SECONDS = 1.0
"""As the SDK's dispatcher: how long the `Connection closed` answer of a cancelled call may take."""
_TRANSPORT = TransportContext(kind="jsonrpc", can_send_request=True)
"""What the SDK's dispatcher gives a stdio request (`_default_transport_builder`): a duplex pipe."""


class StdioLean:
    """The lean path of one stdio session (see the module's docstring)."""

    def __init__(self, server: Server[Any], *, own_tools: frozenset[str], catalog: Any) -> None:
        self.server = server
        self.leave = HotFilter(own_tools, catalog)
        self.outbox: Outbox | None = None
        self.dispatcher: JSONRPCDispatcher[Any] | None = None
        self.connection: Any = None
        """The handshake-era connection; None on a 2026-07-28 one (each request has its own)."""
        self.outbound: Any = None
        self.lifespan_state: Any = None
        self.served = 0
        """Requests answered on this path (each also logged at DEBUG, which the tests read)."""
        server.middleware.append(self._note_session)

    def bind(self, outbox: Outbox) -> None:
        self.outbox = outbox

    async def _note_session(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """A server middleware: remember the dispatcher and connection of this transport's session."""
        if self.dispatcher is None and self.outbox is not None:
            channel = ctx.session._request_outbound
            modern = isinstance(channel, _NoServerRequestsDispatchContext)
            dispatcher = getattr(channel._inner if modern else channel, "_dispatcher", None)  # type: ignore[attr-defined]
            if isinstance(dispatcher, JSONRPCDispatcher) and dispatcher._write_stream is self.outbox:
                self.dispatcher = dispatcher
                self.connection = None if modern else ctx.session._connection
                self.outbound = NotifyOnlyOutbound(dispatcher)
                self.lifespan_state = ctx.lifespan_context
                # One stdio session a process: found, it is found for good, and no request need pass here again.
                self.server.middleware.remove(self._note_session)
        return await call_next(ctx)

    def take(self, line: bytes) -> bool:
        """Serve `line` (True: the answer will follow on the outbox), or leave it to the SDK (False)."""
        dispatcher, connection = self.dispatcher, self.connection
        if dispatcher is None or dispatcher._tg is None or dispatcher._closed:
            return False
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError:
            return False
        work: Callable[[_JSONRPCDispatchContext[Any]], Awaitable[dict[str, Any]]]
        if connection is None:  # a 2026-07-28 connection: enveloped requests, the SDK's runner
            shape = hot_shape(data, self.leave)
            if shape is None:
                return False
            request_id, method, params = shape
            if params is None or not is_enveloped(params):
                return False
            work = partial(self._modern_answer, request_id, method, params)
        else:
            if not connection.initialize_accepted or connection.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
                return False
            hot = hot_request(data, self.server, connection.protocol_version, self.leave)
            if hot is None:
                return False
            request_id, method, params = hot.id, hot.method, hot.params
            work = partial(self._answer, hot)
        channel = _JSONRPCDispatchContext(
            transport=_TRANSPORT,
            _dispatcher=dispatcher,
            _request_id=request_id,
            _progress_token=progress_token_from_params(params),
        )
        scope = anyio.CancelScope()
        # Entered before the next line is read: a `notifications/cancelled` after it finds it.
        dispatcher._in_flight[coerce_request_id(request_id)] = _InFlight(scope=scope, dctx=channel)
        self.served += 1
        logger.debug("lean path: %s %r", method, request_id)
        dispatcher._tg.start_soon(self._serve, dispatcher, request_id, channel, scope, work)
        return True

    async def _answer(self, hot: Hot, channel: _JSONRPCDispatchContext[Any]) -> dict[str, Any]:
        """A handshake-era request's answer: the gateway's middleware and handler (`hot_requests`)."""
        ctx = request_context(hot, channel, self.connection, self.lifespan_state)
        return await outcome(compose(self.server, hot), ctx, hot)

    async def _modern_answer(
        self, request_id: str | int, method: str, params: dict[str, Any], channel: _JSONRPCDispatchContext[Any]
    ) -> dict[str, Any]:
        """A 2026-07-28 request's answer, as `_serve_modern_stream` gives it: the SDK's runner on a
        connection of the request's own envelope, no requests of the client."""
        try:
            route = classify_inbound_request({"method": method, "params": params})
            if isinstance(route, InboundLadderRejection):
                raise MCPError(code=route.code, message=route.message, data=route.data)
            connection = Connection.from_envelope(
                route.protocol_version, route.client_info, route.client_capabilities, outbound=self.outbound
            )
            context = _NoServerRequestsDispatchContext(channel)
            result = await serve_one(
                self.server, context, method, params, connection=connection, lifespan_state=self.lifespan_state
            )
            return {"jsonrpc": "2.0", "id": request_id, "result": result}
        except MCPError as exc:
            error = exc.error
        except ValidationError as exc:
            error = handler_exception_to_error_data(exc) or ErrorData(code=INTERNAL_ERROR, message=str(exc))
        except Exception as exc:  # noqa: BLE001  the SDK's boundary (`modern_error_data` logs what it does not map)
            error = modern_error_data(exc)
        return {
            "jsonrpc": "2.0",
            "id": request_id,
            "error": error.model_dump(by_alias=True, mode="json", exclude_unset=True),
        }

    async def _serve(
        self,
        dispatcher: JSONRPCDispatcher[Any],
        request_id: str | int,
        channel: _JSONRPCDispatchContext[Any],
        scope: anyio.CancelScope,
        work: Callable[[_JSONRPCDispatchContext[Any]], Awaitable[dict[str, Any]]],
    ) -> None:
        """`JSONRPCDispatcher._handle_request` for one lean request: answered unless the client
        cancelled it; cancelled by the session's end, answered `Connection closed`."""
        answering = False
        try:
            with scope:
                try:
                    answer = await work(channel)
                finally:
                    channel.close()
                    key = coerce_request_id(request_id)
                    entry = dispatcher._in_flight.get(key)
                    if entry is not None and entry.dctx is channel:
                        del dispatcher._in_flight[key]
                if not channel.cancel_requested.is_set():
                    answering = True
                    await self._write(answer)
        except anyio.get_cancelled_exc_class():
            if not answering and not channel.cancel_requested.is_set():
                error = {"code": CONNECTION_CLOSED, "message": "Connection closed"}
                with anyio.move_on_after(SHUTDOWN_WRITE_SECONDS, shield=True):
                    await self._write({"jsonrpc": "2.0", "id": request_id, "error": error})
            raise

    async def _write(self, answer: dict[str, Any]) -> None:
        outbox = self.outbox
        if outbox is None or outbox.closed:
            return
        try:
            outbox.write(dump_json(answer) + b"\n")
        except anyio.BrokenResourceError:
            logger.debug("dropped the answer to %r: stdout closed", answer.get("id"))
            return
        await outbox.room()
