"""The per-call deadline. Expiring it cancels the request, which the SDK turns into a
`notifications/cancelled` to the upstream, so a hung tool does not keep working for nobody.

Each call runs in a cancel scope of its own, as under `anyio.fail_after`; what it does not get is a
timer of its own. The deadlines of the calls under way on an event loop share one (`_Deadlines`):
a call's scope is cancelled by it when the call's time is up, exactly as the scope's own timer would,
and a call that ends in time costs a queue entry instead of a timer made, scheduled and cancelled.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from typing import Any

import anyio
import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import UpstreamTimeout
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
                entry[1] = None  # ended: the shared timer forgets it
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
    """The deadlines of the calls under way on one asyncio event loop, behind one timer.

    Calls with the same timeout end their time in the order they started, so each timeout has a
    queue in that order: a call adds its entry at the back, entries of calls that ended leave from
    the front, and the timer is set for the earliest deadline still standing. When it fires, the
    scopes whose time is up are cancelled (what a scope's own timer does) and it is set again."""

    __slots__ = ("_at", "_handle", "_queues", "loop", "scope_class")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.scope_class: Any = type(anyio.CancelScope())
        """The running backend's cancel scope, made without looking the backend up on every call."""
        self._queues: dict[float, deque[list[Any]]] = {}
        self._handle: asyncio.TimerHandle | None = None
        self._at = math.inf

    def add(self, seconds: float, scope: Any) -> list[Any]:
        """Cancel `scope` in `seconds` unless its entry (returned) is emptied first (`entry[1] = None`)."""
        deadline = self.loop.time() + seconds
        entry = [deadline, scope]
        if seconds == math.inf:
            return entry  # never due
        queue = self._queues.get(seconds)
        if queue is None:
            queue = self._queues[seconds] = deque()
        else:
            while queue and queue[0][1] is None:
                queue.popleft()
        queue.append(entry)
        if deadline < self._at:
            self._set(deadline)
        return entry

    def _set(self, at: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = at
        self._handle = self.loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle, self._at = None, math.inf
        now = self.loop.time()
        earliest = math.inf
        due = []
        for seconds, queue in list(self._queues.items()):
            while queue:
                deadline, scope = queue[0]
                if scope is not None and deadline > now:
                    earliest = min(earliest, deadline)
                    break
                queue.popleft()
                if scope is not None:
                    due.append(scope)
            if not queue:
                del self._queues[seconds]
        if earliest < math.inf:
            self._set(earliest)  # first: whatever a cancellation does, the later deadlines stay watched
        for scope in due:
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
