"""Relaying server-to-client requests (sampling, elicitation, roots) to the downstream client.

An upstream server may ask its client, the gateway, for an LLM completion, for user
input, or for the client's roots while it serves a request. The gateway passes the
question to the downstream client whose request caused it, in whichever way that
client's protocol era allows:

- handshake-era clients (up to 2025-11-25) receive an ordinary server-to-client
  request on the same request's stream;
- 2026-07-28 clients cannot receive requests, so the gateway answers their request
  with an `InputRequiredResult` carrying the question, keeps the upstream call
  running in the background (an `Exchange`), and resumes it when the client retries
  with its answers and the echoed `request_state`.

Which downstream request an upstream question belongs to is known exactly when the
question is raised inside the call's own task (2026-07-28 upstreams, and streamable
HTTP, whose transport carries the caller's context), seen through a context variable.
Handshake-era stdio and SSE upstreams send questions on their own channel; the gateway
then relays only if every request in flight on that server comes from one client
session, and refuses otherwise: a question never reaches another user's client. A
client that did not declare the capability gets a clear refusal, never a hang.
"""

from __future__ import annotations

import contextvars
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

__all__ = [
    "Exchange",
    "ExchangeTable",
    "Interactions",
    "Relay",
    "RelayScope",
    "asks_for_progress",
    "connection_of",
    "progress_forwarder",
]

logger = logging.getLogger(__name__)

_RESULT_TYPES: dict[type[Any], type[Any]] = {
    types.CreateMessageRequest: types.CreateMessageResult,
    types.ElicitRequest: types.ElicitResult,
    types.ListRootsRequest: types.ListRootsResult,
}
_CAPABILITY_NAMES = {
    types.CreateMessageRequest: "sampling",
    types.ElicitRequest: "elicitation",
    types.ListRootsRequest: "roots",
}


@dataclass
class RelayScope:
    """One downstream request being served by one upstream."""

    upstream_id: str
    ctx: ServerRequestContext[Any, Any]
    exchange: Exchange | None = None


_current_scope: contextvars.ContextVar[RelayScope | None] = contextvars.ContextVar(
    "mcp_gateway_relay_scope", default=None
)


class Relay:
    """Finds the downstream request an upstream question belongs to, and asks it."""

    def __init__(self) -> None:
        self._in_flight: dict[str, list[RelayScope]] = {}
        self.outgoing: list[Callable[[str, types.InputRequest], types.InputRequest]] = []
        """Rewrites of a question before the client sees it (`(upstream_id, request) -> request`):
        the task proxy's own task ids (`gateway.serving.tasks`)."""

    def scope(
        self, upstream_id: str, ctx: ServerRequestContext[Any, Any], exchange: Exchange | None = None
    ) -> _InFlight:
        """Mark a downstream request as in flight on `upstream_id` for the duration of the block
        (`with relay.scope(...) as scope:`)."""
        return _InFlight(self._in_flight.setdefault(upstream_id, []), RelayScope(upstream_id, ctx, exchange))

    def find(self, upstream_id: str) -> RelayScope | None:
        """The downstream request an upstream's message belongs to, or None if unknown.

        Exact when the message is raised inside the call's own task (2026-07-28
        upstreams, streamable-HTTP upstreams). Otherwise the protocol does not say, and
        the gateway guesses only within one client session: a question must never
        reach another user's client. Requests in flight from several sessions: None.
        """
        current = _current_scope.get()
        if current is not None and current.upstream_id == upstream_id:
            return current
        stack = self._in_flight.get(upstream_id)
        if not stack:
            return None
        sessions = {id(connection_of(scope.ctx)) for scope in stack}
        return stack[-1] if len(sessions) == 1 else None

    def busy(self, upstream_id: str) -> bool:
        """Whether any downstream request is in flight on this upstream."""
        return bool(self._in_flight.get(upstream_id))

    async def ask(self, upstream_id: str, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        """Put an upstream's question to the right downstream client, or refuse clearly."""
        what = _CAPABILITY_NAMES[type(request)]
        scope = self.find(upstream_id)
        if scope is None and self.busy(upstream_id):
            return _refuse(
                f"Server {upstream_id!r} asked for {what}, but requests from several clients are in progress "
                "on it and its protocol does not say which one the question belongs to; the gateway "
                "refuses rather than ask the wrong client. Retry the request."
            )
        if scope is None:
            return _refuse(
                f"Server {upstream_id!r} asked for {what} outside of any client request; the gateway "
                "relays such questions only while a client's request to that server is in progress."
            )
        if not _can_carry_requests(scope):
            return _refuse(
                f"Server {upstream_id!r} asked for {what}, but the client's connection cannot carry "
                "server-to-client requests (stateless HTTP has no session to send them on; a 2026-07-28 "
                "client can answer them, or use a gateway that keeps sessions)."
            )
        if not _client_supports(scope.ctx, request):
            return _refuse(
                f"Server {upstream_id!r} asked for {what}, which the client connected to the gateway does not support."
            )
        for rewrite in self.outgoing:
            request = rewrite(upstream_id, request)
        if scope.exchange is not None:
            return await scope.exchange.ask(request)
        if not scope.ctx.session.can_send_request:
            return _refuse(
                f"Server {upstream_id!r} asked for {what}, but the client's connection cannot carry "
                "server-to-client requests."
            )
        try:
            return await scope.ctx.session.send_request(
                request,
                _RESULT_TYPES[type(request)],
                metadata=ServerMessageMetadata(related_request_id=scope.ctx.request_id),
            )
        except MCPError as exc:
            return exc.error


class _InFlight:
    """`Relay.scope`'s block: a class, not a generator context manager (entered on every proxied request)."""

    __slots__ = ("scope", "stack", "token")

    def __init__(self, stack: list[RelayScope], scope: RelayScope) -> None:
        self.stack, self.scope = stack, scope
        self.token: contextvars.Token[RelayScope | None] | None = None

    def __enter__(self) -> RelayScope:
        self.stack.append(self.scope)
        self.token = _current_scope.set(self.scope)
        return self.scope

    def __exit__(self, *exc_info: object) -> None:
        if self.token is not None:
            _current_scope.reset(self.token)
        self.stack.remove(self.scope)


def connection_of(ctx: ServerRequestContext[Any, Any]) -> Any:
    """The SDK's per-client `Connection` behind a request (not public API in mcp 2.3)."""
    return getattr(ctx.session, "_connection", None)


def _can_carry_requests(scope: RelayScope) -> bool:
    """False for a handshake-era request over stateless HTTP: it has no session, so not even its
    capabilities are known, and nothing can be sent back on it but its own response."""
    if scope.exchange is not None or scope.ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return True
    return scope.ctx.session.can_send_request


def _refuse(message: str) -> types.ErrorData:
    return types.ErrorData(code=types.INVALID_REQUEST, message=message)


def _client_supports(ctx: ServerRequestContext[Any, Any], request: types.InputRequest) -> bool:
    caps = ctx.session.client_capabilities
    if caps is None:
        return False
    if isinstance(request, types.CreateMessageRequest):
        return caps.sampling is not None
    if isinstance(request, types.ElicitRequest):
        return caps.elicitation is not None
    return caps.roots is not None


@dataclass
class Exchange:
    """An upstream call kept running across the retries of a 2026-07-28 client.

    The call runs in a background task. When it needs input, `next_outcome` returns
    the open questions; the client's retry `answer`s them and waits again.
    """

    id: str = field(default_factory=lambda: "gw-" + secrets.token_urlsafe(16))
    ctx: ServerRequestContext[Any, Any] | None = None
    _questions: dict[str, types.InputRequest] = field(default_factory=dict)
    _answers: dict[str, types.InputResponse | types.ErrorData] = field(default_factory=dict)
    _answered: dict[str, anyio.Event] = field(default_factory=dict)
    _changed: anyio.Event = field(default_factory=anyio.Event)
    _done: bool = False
    _result: Any = None
    _error: BaseException | None = None
    _counter: int = 0
    cancel_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    async def ask(self, request: types.InputRequest) -> types.InputResponse | types.ErrorData:
        self._counter += 1
        key = f"q{self._counter}"
        self._questions[key] = request
        self._answered[key] = event = anyio.Event()
        self._changed.set()
        await event.wait()
        return self._answers.pop(key)

    def answer(self, responses: dict[str, types.InputResponse] | None) -> None:
        for key, response in (responses or {}).items():
            if key in self._questions:
                del self._questions[key]
                self._answers[key] = response
                self._answered.pop(key).set()

    async def run(self, call: Callable[[], Awaitable[Any]]) -> None:
        with self.cancel_scope:
            try:
                self._result = await call()
            except Exception as exc:  # noqa: BLE001 - handed to the waiting handler, which re-raises it
                self._error = exc
        self._done = True
        self._changed.set()

    async def next_outcome(self) -> Any:
        """The call's result, or an `InputRequiredResult` with the questions still open."""
        while True:
            if self._done:
                if self._error is not None:
                    raise self._error
                return self._result
            if self._questions:
                return types.InputRequiredResult(input_requests=dict(self._questions), request_state=self.id)
            self._changed = anyio.Event()
            await self._changed.wait()


class ExchangeTable:
    """Open exchanges by id, each abandoned after `ttl` seconds without a retry."""

    def __init__(self, ttl: float = 300.0) -> None:
        self.ttl = ttl
        self._open: dict[str, tuple[Exchange, float]] = {}

    def open(self, exchange: Exchange) -> None:
        self._expire()
        self._open[exchange.id] = (exchange, anyio.current_time() + self.ttl)

    def take(self, exchange_id: str) -> Exchange | None:
        self._expire()
        found = self._open.get(exchange_id)
        if found is None:
            return None
        self._open[exchange_id] = (found[0], anyio.current_time() + self.ttl)
        return found[0]

    def close(self, exchange_id: str) -> None:
        self._open.pop(exchange_id, None)

    def _expire(self) -> None:
        now = anyio.current_time()
        for key, (exchange, deadline) in list(self._open.items()):
            if deadline < now:
                logger.info("abandoning exchange %s: the client did not come back", key)
                exchange.cancel_scope.cancel()
                del self._open[key]


class Interactions:
    """Runs requests that an upstream may interrupt with questions for the client.

    Handshake-era clients are asked directly on the request's stream. A 2026-07-28
    client that declared sampling, elicitation or roots gets an `InputRequiredResult`
    and resumes with its answers; the upstream call waits in an `Exchange` meanwhile.
    """

    def __init__(
        self, relay: Relay, task_group: Callable[[], anyio.abc.TaskGroup], stateless: Callable[[], bool]
    ) -> None:
        self.relay = relay
        self.task_group = task_group
        """Where exchanges run (the registry's): they outlive the request that started them."""
        self.stateless = stateless
        self.exchanges = ExchangeTable()

    async def run(
        self,
        ctx: ServerRequestContext[Any, Any],
        params: types.InputResponseRequestParams,
        upstream_id: str,
        send: Callable[[Any], Awaitable[Any]],
    ) -> Any:
        """`send(progress)` the request to `upstream_id`, relaying its questions; resume it when the
        client comes back with answers (`params.request_state`)."""
        if params.request_state is not None and ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            resumed = self.exchanges.take(params.request_state)
            if resumed is None:
                where = (
                    " (behind a load balancer, answers must reach the replica that asked: they are not shared)"
                    if self.stateless()
                    else ""
                )
                raise MCPError(
                    types.INVALID_PARAMS, f"Unknown or expired request_state: send the original request again{where}."
                )
            resumed.ctx = ctx
            resumed.answer(params.input_responses)
            return await self._outcome(resumed)

        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS or not _may_be_asked(ctx):
            progress = progress_forwarder(lambda: ctx) if asks_for_progress(ctx) else None
            with self.relay.scope(upstream_id, ctx):
                return await send(progress)

        exchange = Exchange(ctx=ctx)

        async def run_call() -> Any:
            # Always a forwarder: the client's retries are new requests, and one may ask for progress.
            with self.relay.scope(upstream_id, ctx, exchange):
                return await send(progress_forwarder(lambda: exchange.ctx or ctx))

        self.exchanges.open(exchange)
        self.task_group().start_soon(exchange.run, run_call)
        return await self._outcome(exchange)

    async def _outcome(self, exchange: Exchange) -> Any:
        try:
            outcome = await exchange.next_outcome()
        except BaseException:
            self.exchanges.close(exchange.id)
            exchange.cancel_scope.cancel()
            raise
        if not isinstance(outcome, types.InputRequiredResult):
            self.exchanges.close(exchange.id)
        return outcome


def _may_be_asked(ctx: ServerRequestContext[Any, Any]) -> bool:
    caps = ctx.session.client_capabilities
    return caps is not None and (caps.sampling is not None or caps.elicitation is not None or caps.roots is not None)


_UNKNOWN = object()


def asks_for_progress(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Whether progress reported on this request reaches its client, so that the upstream request
    should ask for it (a `progressToken`, which costs the upstream a reporter per call).

    Read from the request's channel, where `report_progress` looks: a token on JSON-RPC
    transports (the SDK's and the gateway's lean ones), the caller's callback in memory. A
    channel of another kind: True, as if asked (reporting on it stays a no-op if it was not).
    """
    channel = getattr(ctx.session, "_request_outbound", None)
    channel = getattr(channel, "_inner", channel)  # the SDK's 2026-07-28 wrapper over a stream's channel
    on_progress = getattr(channel, "_on_progress", _UNKNOWN)  # in memory
    if on_progress is not _UNKNOWN:
        return on_progress is not None
    token = getattr(channel, "_progress_token", getattr(channel, "progress_token", _UNKNOWN))
    return token is not None


def progress_forwarder(current: Callable[[], ServerRequestContext[Any, Any]]) -> Any:
    """A progress callback for the upstream call that reports on the client's current request
    (`current`: it changes when a 2026-07-28 client retries with answers)."""

    async def forward(progress: float, total: float | None, message: str | None) -> None:
        try:
            await current().session.report_progress(progress, total, message)
        except Exception:  # boundary: progress is best effort and must not fail the call
            logger.debug("could not forward progress", exc_info=True)

    return forward
