"""The lean path: the hot requests of a streamable-HTTP session served without the SDK's transport.

Profiled under `bench/load.py`, most of what the gateway spends on a proxied call over HTTP is
machinery around the call rather than the call: Starlette's routing, the SDK's 2025-era transport
(validating the message into pydantic models, a memory stream into the session's dispatcher, a
task per request, a memory stream back, a response built by Starlette). `LeanPath` sits in front
of that app (behind `gateway.security.http_guard`, which has already checked Host/Origin,
credentials, scopes' holder, rate limits and body size) and serves one POSTed JSON-RPC request
itself when it can do so exactly as the SDK would:

- a `tools/call`, `tools/list`, `resources/read` or `prompts/get` request, alone in its body
  (no batch), on an open handshake-era session (`Mcp-Session-Id`) whose handshake is done, by
  the credential that opened it, accepting both JSON and SSE, with params the SDK accepts, not
  task-augmented, not one of the gateway's own tools (search may ask the client's model);
- it parses the body once (orjson), validates the params as the SDK does (the same models),
  runs the server's middleware and the gateway's own handler in the request's task, and writes
  the answer as `application/json` with orjson.

The lean path learns a session (its `Connection` and dispatcher) from a request or notification
the SDK served on it, through a server middleware: a request that arrives before then (right
after the handshake, whose `notifications/initialized` is answered before it is handled) is
the SDK's. Everything else goes to the SDK's app unchanged, with the body replayed: the handshake,
notifications and responses, GET and DELETE, unknown sessions, batches, bad JSON, params the
SDK refuses (so its error is the error), 2026-07-28 requests and stateless HTTP.

What the SDK would put on the request's SSE stream is honoured: a notification the call emits
(progress, an upstream's log line) or a request it makes of the client (sampling, elicitation,
roots, through the session's own dispatcher, whose answer comes back on another POST) turns the
answer into a `text/event-stream`, as `gateway.serving.deferred_responses` does, and so does a
call still silent after `window` seconds (then pinged every `window`). A client that hangs up
cancels its call (recorded `cancelled`; the upstream call is cancelled); a client that cancels
the request with `notifications/cancelled` gets the SDK's `REQUEST_CANCELLED` answer.

Reaching into the SDK (mcp 2.3, pinned below 2.4): the session manager's `_server_instances` and
`_session_owners`, the transport's idle accounting (`idle_scope`, `_requests_in_flight`,
`_idle_timeout`), `_request_streams` and `_check_content_type`, the dispatcher's `_in_flight` table (`_InFlight`) and
`send_raw_request(..., _related_request_id=)`. `tests/test_lean_path.py` fails when they change.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import anyio
import orjson
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser, authorization_context
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import (
    REQUEST_CANCELLED,
    REQUEST_STREAM_BUFFER_SIZE,
    EventMessage,
    check_accept_headers,
)
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.dispatcher import CallOptions
from mcp.shared.exceptions import NoBackChannelError
from mcp.shared.jsonrpc_dispatcher import (
    JSONRPCDispatcher,
    _InFlight,
    coerce_request_id,
    progress_token_from_params,
)
from mcp.shared.transport_context import TransportContext
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.lazy_timers import DueEntry, DueQueue, LazyDeadline
from gateway.serving.hot_requests import (
    HOT_METHODS,
    Hot,
    HotFilter,
    compose,
    dump_json,
    hot_request,
    outcome,
    passes_hot_requests,
    request_context,
)
from gateway.serving.http_protocol import HANG_UP_KEY, whole_answers

__all__ = ["HOT_METHODS", "LeanPath"]

logger = logging.getLogger(__name__)

_SSE_HEADERS = [
    (b"cache-control", b"no-cache, no-transform"),
    (b"connection", b"keep-alive"),
    (b"content-type", b"text/event-stream"),
]


_TRANSPORT = TransportContext(kind="streamable-http", can_send_request=True)
"""What each lean request's channel says of its transport (immutable: one for all)."""


@dataclass(slots=True)
class _Session:
    """What the lean path needs of one open session, noted from a request the SDK served on it."""

    transport: Any
    connection: Any
    dispatcher: JSONRPCDispatcher[Any]
    lifespan_state: Any
    idle: _IdleClock | None = None
    session_id: bytes = b""
    """The `Mcp-Session-Id` value each answer carries."""


class _IdleClock:
    """A session's idle expiry while the lean path serves it: what the SDK transport's
    `handle_request` does to `idle_scope` (its deadline at inf while a request is in flight, then
    `now + idle_timeout`), with one lazily moved timer (`LazyDeadline`) instead of a deadline
    moved (a timer cancelled and one scheduled) twice a request.

    A lean request counts itself in the transport's `_requests_in_flight`, as the SDK's do, and
    moves the clock to `idle_timeout` after it ended; the scope's deadline stays at inf. When the
    clock is reached, the session has been idle that long (the scope's deadline set to now, so
    the session ends, as the SDK's deadline would have ended it), or a request is in flight (a
    whole period on). Once a request of the SDK's own ends last, it sets a finite deadline: the
    SDK's governs again and the clock stops, until the next lean request takes over."""

    __slots__ = ("_transport", "_scope", "_timeout", "_loop", "_clock")

    def __init__(self, transport: Any, scope: anyio.CancelScope, timeout: float) -> None:
        self._transport = transport
        self._scope = scope
        self._timeout = timeout
        self._loop = asyncio.get_running_loop()
        self._clock = LazyDeadline(self._loop, self._reached)

    def begin(self) -> None:
        self._transport._requests_in_flight += 1
        if self._scope.deadline != math.inf:
            self._scope.deadline = math.inf  # the SDK's deadline (after a request of its own): ours now
        if self._clock.at is None:
            self._clock.set(self._loop.time() + self._timeout)

    def end(self) -> None:
        self._transport._requests_in_flight -= 1
        self._clock.set(self._loop.time() + self._timeout)

    def _reached(self) -> None:
        scope = self._scope
        if scope.deadline != math.inf or scope.cancel_called:
            return  # the SDK's deadline again (or the session over)
        now = self._loop.time()
        if self._transport._requests_in_flight:
            self._clock.set(now + self._timeout)
            return
        scope.deadline = now  # the session ends as the SDK's own deadline would end it


_MEDIA_KEPT = 64
"""Content-Type and Accept pairs whose check is kept (clients send one or two)."""


class _Answer:
    """The HTTP answer to one lean request: a JSON body, or an SSE stream once anything comes first."""

    def __init__(self, send: Send, session_id: bytes) -> None:
        self._send = send
        self._whole = whole_answers(send)
        self._session_id = session_id
        self._lock = asyncio.Lock()  # asyncio's own primitives: anyio's look the backend up on every creation
        self.streaming = False

    async def _open_stream(self) -> None:
        if not self.streaming:
            self.streaming = True
            headers = [*_SSE_HEADERS, (b"mcp-session-id", self._session_id)]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})

    async def event(self, message: Mapping[str, Any]) -> None:
        """One message on the request's stream (sse-starlette's framing, as the SDK's)."""
        async with self._lock:
            await self._open_stream()
            data = b"event: message\r\ndata: " + dump_json(message) + b"\r\n\r\n"
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def ping(self) -> None:
        async with self._lock:
            await self._open_stream()
            await self._send({"type": "http.response.body", "body": b": ping\r\n\r\n", "more_body": True})

    async def finish(self, message: Mapping[str, Any]) -> None:
        """The request's answer: the last event of a stream, else the whole JSON body."""
        body = dump_json(message)
        async with self._lock:
            if self.streaming:
                data = b"event: message\r\ndata: " + body + b"\r\n\r\n"
                await self._send({"type": "http.response.body", "body": data, "more_body": False})
                return
            if self._whole is not None:
                head = b"content-type: application/json\r\ncontent-length: %d\r\nmcp-session-id: %s\r\n" % (
                    len(body),
                    self._session_id,
                )
                if self._whole(head, body):
                    return
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"mcp-session-id", self._session_id),
            ]
            await self._send({"type": "http.response.start", "status": 200, "headers": headers})
            await self._send({"type": "http.response.body", "body": body})


class _LeanDispatch:
    """The request-scoped channel a handler's `ServerSession` talks through (the SDK's
    `DispatchContext`): notifications go on the answer's stream; a request of the client goes
    through the session's own dispatcher, related to this request, so that the transport routes
    it here and the client's answer (another POST) resolves it."""

    def __init__(self, request_id: Any, params: Mapping[str, Any] | None, session: _Session, answer: _Answer) -> None:
        self._request_id = request_id
        self._progress_token = progress_token_from_params(params)
        self._session = session
        self._answer = answer
        self.transport = _TRANSPORT
        self.message_metadata = None
        self.cancel_requested = asyncio.Event()
        self.closed = False
        self._forwarder: asyncio.Task[None] | None = None

    @property
    def request_id(self) -> Any:
        return self._request_id

    @property
    def can_send_request(self) -> bool:
        return not self.closed

    async def notify(self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None) -> None:
        if self.closed:
            logger.debug("dropped %s: the request was answered", method)
            return
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        await self._answer.event(message)

    async def send_raw_request(
        self, method: str, params: Mapping[str, Any] | None, opts: CallOptions | None = None
    ) -> dict[str, Any]:
        if self.closed:
            raise NoBackChannelError(method)
        self._forward_related()
        return await self._session.dispatcher.send_raw_request(
            method, params, opts, _related_request_id=self._request_id
        )

    async def progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        if self._progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self._progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self.notify("notifications/progress", params)

    def _forward_related(self) -> None:
        """Have the transport route what the dispatcher sends for this request to the answer."""
        if self._forwarder is not None:
            return
        key = str(self._request_id)
        streams = anyio.create_memory_object_stream[EventMessage](REQUEST_STREAM_BUFFER_SIZE)
        self._session.transport._request_streams[key] = streams

        async def forward() -> None:
            try:
                async for item in streams[1]:
                    await self._answer.event(item.message.model_dump(by_alias=True, mode="json", exclude_unset=True))
            finally:
                if self._session.transport._request_streams.get(key) is streams:
                    del self._session.transport._request_streams[key]

        self._forwarder = asyncio.get_running_loop().create_task(forward())

    async def close(self) -> None:
        """No more messages for this request: what was routed here already is forwarded first."""
        self.closed = True
        if self._forwarder is not None:
            streams = self._session.transport._request_streams.pop(str(self._request_id), None)
            if streams is not None:
                await streams[0].aclose()
            with suppress(Exception):  # a client gone mid-stream: the answer goes nowhere either
                await self._forwarder


class LeanPath:
    """An ASGI layer before the SDK's streamable-HTTP app (see the module's docstring)."""

    def __init__(
        self,
        app: ASGIApp,
        server: Server[Any],
        manager: StreamableHTTPSessionManager,
        *,
        path: str,
        window: float,
        own_tools: frozenset[str],
        catalog: Any,
    ) -> None:
        self.app = app
        self.server = server
        self.manager = manager
        self.path = path
        self.window = window
        self.leave = HotFilter(own_tools, catalog)
        """Tool names the gateway answers itself (search may ask the client's model): the SDK's."""
        self.sessions: dict[str, _Session] = {}
        self._silences: DueQueue[_Watcher] | None = None
        """Lean requests in flight, each told when it has been silent for `window` (one timer)."""
        self._media_checked: dict[tuple[bytes | None, bytes | None], bool] = {}
        self.served = 0
        """Requests answered on this path (each also logged at DEBUG, which the tests read)."""
        server.middleware.append(self._note_session)

    # ---- noting sessions as the SDK serves them --------------------------------------------

    @passes_hot_requests  # the lean path serves only sessions it has noted already
    async def _note_session(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        """A server middleware: remember the connection and dispatcher behind each session id."""
        request = ctx.request
        if isinstance(request, Request) and ctx.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS:
            session_id = request.headers.get("mcp-session-id")
            if session_id is not None and session_id not in self.sessions:
                self._note(session_id, ctx)
        return await call_next(ctx)

    def _note(self, session_id: str, ctx: ServerRequestContext[Any, Any]) -> None:
        transport = self.manager._server_instances.get(session_id)
        channel = getattr(ctx.session, "_request_outbound", None)
        dispatcher = getattr(channel, "_dispatcher", None)
        connection = getattr(ctx.session, "_connection", None)
        if transport is None or connection is None or not isinstance(dispatcher, JSONRPCDispatcher):
            return
        if len(self.sessions) >= 2 * len(self.manager._server_instances) + 16:
            for gone in [sid for sid in self.sessions if sid not in self.manager._server_instances]:
                del self.sessions[gone]
        session = _Session(transport, connection, dispatcher, ctx.lifespan_context)
        session.session_id = session_id.encode("latin-1")  # the transport's own id (its key)
        idle = transport.idle_scope
        if idle is not None and transport._idle_timeout is not None:
            session.idle = _IdleClock(transport, idle, transport._idle_timeout)
        self.sessions[session_id] = session

    # ---- ASGI ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive) if scope["type"] == "http" and scope["method"] == "POST" else None
        session = self._session_for(scope, request) if request is not None else None
        if session is None or request is None:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request" or not message.get("more_body", False):
                break
        hot = _hot_request(messages, self.server, session.connection.protocol_version, self.leave)
        if hot is None:
            await self.app(scope, _replaying(messages, receive), send)
            return
        self.served += 1
        logger.debug("lean path: %s %r", hot.method, hot.id)
        await self._serve(session, hot, request, scope, receive, send)

    def _session_for(self, scope: Scope, request: Request) -> _Session | None:
        """The open session a POST to the endpoint names, when the lean path may serve it (`request`:
        the one the handler gets, whose headers are parsed once)."""
        if scope["path"] != self.path:
            return None
        session_id = version = content_type = accept = None
        for name, value in scope["headers"]:  # the last session id and version; the first of the others
            if name == b"mcp-session-id":
                session_id = value
            elif name == b"mcp-protocol-version":
                version = value
            elif name == b"content-type":
                content_type = value if content_type is None else content_type
            elif name == b"accept":
                accept = value if accept is None else accept
        if session_id is None:
            return None
        key = session_id.decode("latin-1")
        session = self.sessions.get(key)
        if session is None or self.manager._server_instances.get(key) is not session.transport:
            return None
        transport: Any = session.transport
        if transport.is_terminated or (transport.idle_scope is not None and transport.idle_scope.cancel_called):
            return None
        user = scope.get("user")
        requestor = authorization_context(user) if isinstance(user, AuthenticatedUser) else None
        if requestor != self.manager._session_owners.get(key):
            return None
        connection = session.connection
        if version is not None and version.decode("latin-1") != connection.protocol_version:
            return None
        if not connection.initialize_accepted or connection.protocol_version not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None
        if not self._media_types_pass(content_type, accept, transport, request):
            return None
        return session

    def _media_types_pass(
        self, content_type: bytes | None, accept: bytes | None, transport: Any, request: Request
    ) -> bool:
        """The SDK's own checks of both headers (`_check_content_type`, `check_accept_headers`), as
        its transport runs them; their answer, which depends on the two values alone, is kept."""
        key = (content_type, accept)
        found = self._media_checked.get(key)
        if found is None:
            found = transport._check_content_type(request) and all(check_accept_headers(request))
            if len(self._media_checked) >= _MEDIA_KEPT:
                self._media_checked.clear()
            self._media_checked[key] = found
        return found

    async def _serve(
        self, session: _Session, hot: Hot, request: Request, scope: Scope, receive: Receive, send: Send
    ) -> None:
        idle = session.idle
        if idle is None:
            await self._answer(session, hot, request, scope, receive, send)
            return
        idle.begin()  # a request in flight holds the session, as in the transport's handle_request
        try:
            await self._answer(session, hot, request, scope, receive, send)
        finally:
            idle.end()

    async def _answer(
        self, session: _Session, hot: Hot, request: Request, scope: Scope, receive: Receive, send: Send
    ) -> None:
        answer = _Answer(send, session.session_id)
        channel = _LeanDispatch(hot.id, hot.params, session, answer)
        ctx = request_context(hot, channel, session.connection, session.lifespan_state, request)
        call = compose(self.server, hot)
        call_scope = anyio.CancelScope()
        in_flight, key = session.dispatcher._in_flight, coerce_request_id(hot.id)
        in_flight[key] = _InFlight(scope=call_scope, dctx=channel)  # type: ignore[arg-type]  # the client may cancel it
        result: dict[str, Any] | None = None
        silences = self._silences
        if silences is None:
            silences = self._silences = DueQueue(asyncio.get_running_loop(), self.window, _Watcher.silent)
        watcher = _Watcher(silences, receive, answer, call_scope, scope.get(HANG_UP_KEY))
        try:
            with call_scope:
                result = await outcome(call, ctx, hot)
        finally:
            watcher.stop()
            await channel.close()
            entry = in_flight.get(key)
            if entry is not None and entry.dctx is channel:  # type: ignore[comparison-overlap]
                del in_flight[key]
        if watcher.gone:
            return  # the client hung up: nobody to answer
        if channel.cancel_requested.is_set() or result is None:
            error = {"code": REQUEST_CANCELLED, "message": "Request cancelled"}
            result = {"jsonrpc": "2.0", "id": hot.id, "error": error}
        await answer.finish(result)


class _Watcher:
    """While a call runs: notices the client hanging up (the call cancelled, `gone`), and opens a
    silent call's answer as a stream with a ping every `window`.

    The gateway's HTTP protocol offers a hook called on the hang-up (`HANG_UP_KEY` in the scope,
    `gateway.serving.http_protocol`): then no task runs until the call has been silent for
    `window` (a `DueQueue` of them all says when). Elsewhere (h11, an ASGI test client) a task reads
    `http.disconnect` throughout."""

    __slots__ = ("window", "gone", "_silence", "_receive", "_answer", "_call", "_hook", "_task")

    def __init__(
        self,
        silences: DueQueue[_Watcher],
        receive: Receive,
        answer: _Answer,
        call: anyio.CancelScope,
        hook: Callable[[Callable[[], None] | None], None] | None,
    ) -> None:
        self.window = silences.delay
        self.gone = False
        self._silence: DueEntry[_Watcher] | None = None
        self._receive = receive
        self._answer = answer
        self._call = call
        self._hook = hook
        self._task: asyncio.Task[None] | None = None
        loop = asyncio.get_running_loop()
        if hook is None:
            self._task = loop.create_task(self._watch(ping_first=False))
        else:
            hook(self._hung_up)
            self._silence = silences.add(self)

    def _hung_up(self) -> None:
        self.gone = True
        self._call.cancel()

    def silent(self) -> None:
        """The call has been silent for `window`: its answer becomes a stream, pinged."""
        self._task = asyncio.get_running_loop().create_task(self._watch(ping_first=True))

    def stop(self) -> None:
        if self._silence is not None:
            self._silence.done()
        if self._hook is not None:
            self._hook(None)
        if self._task is not None:
            self._task.cancel()

    async def _watch(self, *, ping_first: bool) -> None:
        while True:
            if not ping_first:
                try:
                    async with asyncio.timeout(self.window):
                        message = await self._receive()
                except TimeoutError:
                    pass
                else:
                    if message["type"] == "http.disconnect":
                        self._hung_up()
                        return
                    continue
            ping_first = False
            try:
                await self._answer.ping()
            except OSError:
                self._hung_up()
                return


def _hot_request(messages: list[Message], server: Server[Any], version: str, leave: HotFilter) -> Hot | None:
    """The one hot request in this body (`gateway.serving.hot_requests`); None: the SDK's."""
    if messages[-1]["type"] != "http.request":
        return None
    try:
        data = orjson.loads(b"".join(m.get("body", b"") for m in messages))
    except orjson.JSONDecodeError:
        return None
    return hot_request(data, server, version, leave)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """`receive` giving back what was read first, for the SDK's app."""
    pending = list(messages)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return replay
