"""A tool call as it travels through the middleware chain, and how the chain is composed."""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import mcp_types as types

__all__ = ["CallHandler", "Middleware", "ToolCall", "compose", "matches_any"]


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


CallHandler = Callable[[ToolCall], Awaitable[types.CallToolResult]]
Middleware = Callable[[ToolCall, CallHandler], Awaitable[types.CallToolResult]]


async def send_call(call: ToolCall) -> types.CallToolResult:
    """The innermost handler: run the request."""
    call.attempts += 1
    return await call.send(call.arguments)


def compose(middleware: Sequence[Middleware], innermost: CallHandler = send_call) -> CallHandler:
    """`middleware[0]` runs first and wraps all the others; the last one wraps `innermost`."""
    handler = innermost
    for layer in reversed(middleware):
        handler = partial(_step, layer, handler)
    return handler


async def _step(layer: Middleware, call_next: CallHandler, call: ToolCall) -> types.CallToolResult:
    return await layer(call, call_next)


def matches_any(name: str, patterns: Sequence[str] | Mapping[str, Any]) -> bool:
    """Whether `name` matches one of the fnmatch globs (case-sensitive)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
