"""The per-call deadline. Expiring it cancels the request, which the SDK turns into a
`notifications/cancelled` to the upstream, so a hung tool does not keep working for nobody.

Each call runs in a cancel scope of its own, as under `anyio.fail_after`; what it does not get is a
timer of its own. The calls under way on an event loop with the same timeout share one
(`gateway.lazy_timers.DueQueue`, `_Deadlines`): a call's scope is cancelled by it when the call's
time is up, exactly as the scope's own timer would, and a call that ends in time costs a queue
entry instead of a timer made, scheduled and cancelled.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from typing import Any

import anyio
import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import UpstreamTimeout
from gateway.lazy_timers import DueEntry, DueQueue
from gateway.observability import tracing

__all__ = ["apply_timeout"]


async def apply_timeout(call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
    """Run the rest of the chain within `call.timeout` seconds, else raise `upstream_timeout`."""
    started_ns = time.time_ns()
    deadlines = _deadlines()
    # A bare cancel scope, not `fail_after` (two generator context managers around the same scope): only
    # its deadline cancels it, so a block that does not return here was cut by the deadline. A
    # `TimeoutError` from inside counts as the deadline's, as it did under `fail_after`.
    try:
        if deadlines is None:  # not on asyncio: the scope's own timer
            with anyio.CancelScope(deadline=anyio.current_time() + call.timeout):
                return await call_next(call)
        else:
            scope = deadlines.scope_class()
            entry = deadlines.add(call.timeout, scope)
            try:
                with scope:
                    return await call_next(call)
            finally:
                if entry is not None:
                    entry.done()  # ended: the shared timer forgets it
    except TimeoutError:
        pass
    error = UpstreamTimeout(
        f"Server {call.server!r} did not finish {call.name!r} within {call.timeout:g} s; the call was "
        f"cancelled. {_what_next(call)}",
        server=call.server,
        sent=True,
        details={"timeout_seconds": call.timeout},
    )
    tracing.record_span(
        "gateway.timeout", error, started_ns=started_ns, attributes={"mcp_gateway.timeout_seconds": call.timeout}
    )
    raise error from None


def _what_next(call: ToolCall) -> str:
    """A tool that is safe to repeat may simply be tried again; any other may have done its work already."""
    if call.idempotent:
        return "Try again later, or with arguments that ask for less work."
    return (
        "It may have run in part or in full before it was cancelled, and the tool is not marked as safe "
        "to repeat: check whether its effect happened (read the state it changes) before calling it again."
    )


class _Deadlines:
    """The deadlines of the calls under way on one asyncio event loop: one `DueQueue` (and so
    one timer) per timeout value, since calls with the same timeout end their time in the order
    they started. When one falls due its scope is cancelled, as the scope's own timer would."""

    __slots__ = ("_queues", "loop", "scope_class")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.scope_class: Any = type(anyio.CancelScope())
        """The running backend's cancel scope, made without looking the backend up on every call."""
        self._queues: dict[float, DueQueue[Any]] = {}

    def add(self, seconds: float, scope: Any) -> DueEntry[Any] | None:
        """Cancel `scope` in `seconds` unless its entry (returned; None: never due) is done first."""
        if seconds == math.inf:
            return None
        queue = self._queues.get(seconds)
        if queue is None:
            queue = self._queues[seconds] = DueQueue(self.loop, seconds, _cancel)
        return queue.add(scope)


def _cancel(scope: Any) -> None:
    scope.cancel()


class _PerThread(threading.local):
    deadlines: _Deadlines | None = None


_state = _PerThread()
"""Each thread's running loop's deadlines (a loop runs in one thread; tests start a loop per test)."""


def _deadlines() -> _Deadlines | None:
    """The running asyncio loop's deadlines; None on another backend."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    deadlines = _state.deadlines
    if deadlines is None or deadlines.loop is not loop:
        deadlines = _state.deadlines = _Deadlines(loop)
    return deadlines
