"""One circuit breaker per upstream: stop sending calls to a server that keeps failing.

Closed: calls go through; `failures` consecutive upstream failures (unreachable or timed
out — not tool errors, which mean the server is working) open it. Open: calls fail at
once with `circuit_open` for `reset_seconds`. Half-open: one probe call goes through;
its success closes the breaker, its failure opens it again for another period.

A fresh session with the server (`reconnected`: it answered a new handshake) closes the
breaker at once: the server that failed is gone, and the one that answered deserves calls.
Each verdict counts in the period that admitted its call (a period ends whenever the
breaker opens, closes or lets a probe through): a call sent to the old connection that
fails late neither counts twice nor holds the new one back.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import CircuitOpen, UpstreamTimeout, UpstreamUnavailable
from gateway.observability import tracing

__all__ = ["Admission", "BreakerState", "CircuitBreaker", "CircuitBreakers", "refusal"]

BreakerState = Literal["closed", "open", "half-open"]

_UPSTREAM_FAILURES = (UpstreamUnavailable, UpstreamTimeout)

PROBE_RETRY_SECONDS = 1
"""What a call refused while the half-open probe is in flight is told to wait."""


@dataclass(frozen=True)
class Admission:
    """A call let through, and the period it was let through in."""

    period: int


@dataclass
class CircuitBreaker:
    """The breaker of one server. `clock` is injectable so tests need not sleep."""

    failures: int
    reset_seconds: float
    clock: Callable[[], float] = time.monotonic
    consecutive: int = 0
    opened_at: float | None = None
    probing: bool = False
    period: int = 0
    """Bumped whenever the breaker opens, closes or admits a probe; see the module's docstring."""
    _admission: Admission | None = field(default=None, repr=False, compare=False)

    @property
    def state(self) -> BreakerState:
        if self.opened_at is None:
            return "closed"
        return "half-open" if self.clock() - self.opened_at >= self.reset_seconds else "open"

    def seconds_left(self) -> float:
        return 0.0 if self.opened_at is None else max(0.0, self.opened_at + self.reset_seconds - self.clock())

    def admit(self) -> Admission | None:
        """Whether a call may go now (None: not); in half-open state one probe at a time."""
        if self.opened_at is None:  # closed: the period's one admission, shared by its calls
            admission = self._admission
            if admission is None or admission.period != self.period:
                admission = self._admission = Admission(self.period)
            return admission
        state = self.state
        if state == "half-open" and not self.probing:
            self.probing = True
            self.period += 1
            return Admission(self.period)
        return None

    def succeeded(self, admission: Admission | None = None) -> None:
        """The server answered: whenever the call was admitted, the server works."""
        self._close()

    def failed(self, admission: Admission | None = None) -> None:
        """A failure of a call admitted as `admission` (None: now)."""
        if admission is not None and admission.period != self.period:
            return  # admitted before the breaker last changed: already accounted for
        self.consecutive += 1
        if self.probing or self.consecutive >= self.failures:
            self.opened_at = self.clock()
            self.probing = False
            self.period += 1

    def released(self, admission: Admission | None = None) -> None:
        """The call ended without telling whether the server works (e.g. bad arguments)."""
        if admission is None or admission.period == self.period:
            self.probing = False

    def reconnected(self) -> None:
        """A fresh session answered its handshake: close at once (see the module's docstring)."""
        if self.opened_at is not None or self.consecutive:
            self._close()

    def _close(self) -> None:
        self.consecutive, self.opened_at, self.probing = 0, None, False
        self.period += 1


def refusal(server: str, breaker: CircuitBreaker) -> CircuitOpen:
    """The error for a call the breaker holds back: when the next attempt is made, never "0 s"."""
    left = math.ceil(breaker.seconds_left())
    failed = f"Server {server!r} failed {breaker.consecutive} calls in a row"
    if left > 0:
        text = (
            f"{failed}, so the gateway is holding calls to it for {left} s more, then lets one through to test it. "
            "Use another tool meanwhile, or try again after that."
        )
    else:
        left = PROBE_RETRY_SECONDS
        text = f"{failed}; one call is testing it right now. Try again in {left} s, or use another tool meanwhile."
    return CircuitOpen(text, server=server, details={"retry_after_seconds": left})


class CircuitBreakers:
    """The breaker middleware: one `CircuitBreaker` per server id, made on first use."""

    def __init__(self, failures: int, reset_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.failures, self.reset_seconds, self.clock = failures, reset_seconds, clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._sessions: dict[str, int] = {}

    def get(self, server: str) -> CircuitBreaker:
        breaker = self._breakers.get(server)
        if breaker is None:
            breaker = self._breakers[server] = CircuitBreaker(self.failures, self.reset_seconds, self.clock)
        return breaker

    def state(self, server: str) -> BreakerState:
        return self.get(server).state

    def session_started(self, server: str, session: int) -> None:
        """The server's connection number `session` answered its handshake; a new number closes its breaker."""
        if self._sessions.get(server) != session:
            self._sessions[server] = session
            self.get(server).reconnected()

    def forget(self, server: str) -> None:
        """Drop a removed server's breaker: a server added later under its id starts closed."""
        self._breakers.pop(server, None)
        self._sessions.pop(server, None)

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        breaker = self.get(call.server)
        admission = breaker.admit()
        if admission is None:
            refused = refusal(call.server, breaker)
            tracing.record_span("gateway.breaker", refused, attributes={"mcp_gateway.breaker.state": breaker.state})
            raise refused
        try:
            result = await call_next(call)
        except _UPSTREAM_FAILURES:
            breaker.failed(admission)
            raise
        except BaseException:  # bad arguments, a protocol error, a cancelled call: no verdict
            breaker.released(admission)
            raise
        breaker.succeeded(admission)
        return result
