"""A tool call as it travels through the middleware chain, and how the chain is composed."""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import anyio.lowlevel
import mcp_types as types

from gateway.errors import GatewayError

__all__ = [
    "REFUSED_NOTE",
    "CallHandler",
    "Caller",
    "Check",
    "CheckLayer",
    "Middleware",
    "ToolCall",
    "compose",
    "matches_any",
    "refuse",
]

REFUSED_NOTE = "refused"
"""`ToolCall.notes` key an admission layer sets when it refuses a call: it never reached a server."""


def _any_tool(tool: types.Tool) -> bool:
    return True


@dataclass(frozen=True)
class Caller:
    """Who makes a call, as the downstream server knows them. A call the gateway makes itself
    (`mcp-gateway call`) has none, and the admission layers let it through."""

    principal: Any = None
    """The authenticated `gateway.security.auth.Principal`, or None (stdio, in memory, no `auth:`)."""
    connection: Any = None
    """The client's session, whose calls `max_calls_per_session` counts; None: not counted (stateless HTTP)."""
    can_run: Callable[[types.Tool], bool] = _any_tool
    """Whether this client can run a tool (one that requires MCP tasks, only a client that declared them)."""


@dataclass
class ToolCall:
    """One `tools/call` on its way to an upstream.

    `send` performs the request itself (progress forwarding and `_meta` already bound);
    middleware decides whether, when and how often it runs.
    """

    server: str
    """The upstream's id."""
    name: str
    """The exposed name, `prefix__tool`."""
    original: str
    """The tool's name on its server."""
    tool: types.Tool
    arguments: dict[str, Any] | None
    send: Callable[[dict[str, Any] | None], Awaitable[types.CallToolResult]]
    timeout: float
    """Seconds each attempt may take: the server's default or the tool's override."""
    idempotent: bool
    """Whether running it twice is safe (annotations or the config's `retry_tools`)."""
    attempts: int = 0
    """How many times `send` has been started so far."""
    notes: dict[str, Any] = field(default_factory=dict)
    """Free space for middleware to leave facts for the ones outside it."""
    caller: Caller | None = None
    """Who calls (None: the gateway itself); the admission layers check what they may call."""
    failures: list[tuple[int, BaseException]] | None = None
    """Where `send_call` notes each attempt that failed with a gateway error, as (attempt, error),
    when a layer keeps them (the records' recorder sets a list); None: nobody does."""
    unresolved: Exception | None = None
    """Why the name did not resolve to a tool (its server is down and was never listed, the tool is
    withheld, the name is unknown); the admission layers refuse such a call with it. `server` is
    then the owner's id (or ""), and `tool` a definition with the name alone."""


CallHandler = Callable[[ToolCall], Awaitable[types.CallToolResult]]
Middleware = Callable[[ToolCall, CallHandler], Awaitable[types.CallToolResult]]


async def send_call(call: ToolCall) -> types.CallToolResult:
    """The innermost handler: run the request.

    A call cancelled while its answer was on the way (a client that hung up, with a plugin's tool in a
    worker thread the cancellation could not stop) ends cancelled, not with the answer nobody receives:
    every layer outside counts and records it as cancelled."""
    call.attempts += 1
    try:
        result = await call.send(call.arguments)
    except GatewayError as error:
        if call.failures is not None:
            call.failures.append((call.attempts, error))
        raise
    await anyio.lowlevel.checkpoint_if_cancelled()
    return result


def compose(middleware: Sequence[Middleware], innermost: CallHandler = send_call) -> CallHandler:
    """`middleware[0]` runs first and wraps all the others; the last one wraps `innermost`.

    Composed once per chain (the registry recomposes only when a layer is added): a call then costs
    each layer one coroutine, not two (a link hands on the layer's own awaitable). A layer that only
    checks a call before the rest runs (`CheckLayer`: admission, validation) costs none: a run of
    them is one link that calls each check, then hands on the rest's awaitable."""
    handler = innermost
    checks: list[Check] = []
    for layer in reversed(middleware):
        check = layer.check if isinstance(layer, CheckLayer) else None
        if check is not None:
            checks.append(check)
            continue
        if checks:
            handler, checks = _Checked(checks, handler), []
        handler = _Link(layer, handler)
    return _Checked(checks, handler) if checks else handler


Check = Callable[[ToolCall], None]
"""Raises to refuse a call (`refuse`); returns to let it go on."""


@runtime_checkable
class CheckLayer(Protocol):
    """A middleware that only checks a call before the rest of the chain: calling it is `check(call)`,
    then `call_next(call)` awaited as it is. `compose` calls the check alone, in no coroutine of its own."""

    def check(self, call: ToolCall) -> None: ...

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult: ...


class _Link:
    """One layer bound to the rest of the chain: calling it returns the layer's awaitable as it is."""

    __slots__ = ("layer", "rest")

    def __init__(self, layer: Middleware, rest: CallHandler) -> None:
        self.layer, self.rest = layer, rest

    def __call__(self, call: ToolCall) -> Awaitable[types.CallToolResult]:
        return self.layer(call, self.rest)


class _Checked:
    """A run of checks bound to the rest of the chain, in order (outermost first)."""

    __slots__ = ("checks", "rest")

    def __init__(self, checks: list[Check], rest: CallHandler) -> None:
        self.checks, self.rest = tuple(reversed(checks)), rest

    def __call__(self, call: ToolCall) -> Awaitable[types.CallToolResult]:
        for check in self.checks:
            check(call)
        return self.rest(call)


def refuse(call: ToolCall, error: Exception) -> Exception:
    """Mark `call` as refused before it reached a server (the records keep only a summary of such a
    call), and return `error` for the layer to raise."""
    call.notes[REFUSED_NOTE] = True
    return error


def matches_any(name: str, patterns: Sequence[str] | Mapping[str, Any]) -> bool:
    """Whether `name` matches one of the fnmatch globs (case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
