"""One circuit breaker per upstream: stop sending calls to a server that keeps failing.

Closed: calls go through; `failures` consecutive upstream failures (unreachable or timed
out — not tool errors, which mean the server is working) open it. Open: calls fail at
once with `circuit_open` for `reset_seconds`. Half-open: one probe call goes through;
its success closes the breaker, its failure opens it again for another period.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import CircuitOpen, UpstreamTimeout, UpstreamUnavailable

__all__ = ["BreakerState", "CircuitBreaker", "CircuitBreakers"]

BreakerState = Literal["closed", "open", "half-open"]

_UPSTREAM_FAILURES = (UpstreamUnavailable, UpstreamTimeout)


@dataclass
class CircuitBreaker:
    """The breaker of one server. `clock` is injectable so tests need not sleep."""

    failures: int
    reset_seconds: float
    clock: Callable[[], float] = time.monotonic
    consecutive: int = 0
    opened_at: float | None = None
    probing: bool = False

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.reset_seconds else "open"

    def seconds_left(self) -> float:
        return 0.0 if self.opened_at is None else max(0.0, self.opened_at + self.reset_seconds - self.clock())

    def admit(self) -> bool:
        """Whether a call may go now; in half-open state only one probe at a time."""
        state = self.state
        if state == "closed":
            return True
        if state == "half-open" and not self.probing:
            self.probing = True
            return True
        return False

    def succeeded(self) -> None:
        self.consecutive, self.opened_at, self.probing = 0, None, False

    def failed(self) -> None:
        self.consecutive += 1
        if self.probing or self.consecutive >= self.failures:
            self.opened_at = self.clock()
        self.probing = False

    def released(self) -> None:
        """The call ended without telling whether the server works (e.g. bad arguments)."""
        self.probing = False


class CircuitBreakers:
    """The breaker middleware: one `CircuitBreaker` per server id, made on first use."""

    def __init__(self, failures: int, reset_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures, self.reset_seconds, self.clock = failures, reset_seconds, clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def get(self, server: str) -> CircuitBreaker:
        breaker = self._breakers.get(server)
        if breaker is None:
            breaker = self._breakers[server] = CircuitBreaker(self.failures, self.reset_seconds, self.clock)
        return breaker

    def state(self, server: str) -> BreakerState:
        return self.get(server).state

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        breaker = self.get(call.server)
        if not breaker.admit():
            raise CircuitOpen(
                f"Server {call.server!r} failed {breaker.consecutive} calls in a row, so the gateway is holding "
                f"calls to it for {breaker.seconds_left():.0f} s more, then lets one through to test it. "
                "Use another tool meanwhile, or try again after that.",
                server=call.server,
                details={"retry_after_seconds": round(breaker.seconds_left(), 1)},
            )
        try:
            result = await call_next(call)
        except _UPSTREAM_FAILURES:
            breaker.failed()
            raise
        except BaseException:  # bad arguments, a protocol error, a cancelled call: no verdict
            breaker.released()
            raise
        breaker.succeeded()
        return result
