"""Retries that never run a non-idempotent tool twice.

- A failure before the request reached the upstream (not connected, connection refused)
  is always retried: the tool did not run.
- Once the request was sent (the connection died mid-call), only tools annotated
  `readOnlyHint` or `idempotentHint`, or listed in the server's `retry_tools`, are retried.
- A timeout is not retried: the call already had its whole time.
- A call that was sent and then lost with its connection, and is not retried, ends in
  `OutcomeUnknown` (`outcome_unknown`): it may have run, so the model is told to check
  before calling it again, never just to try again.
Attempts and total time are bounded; between attempts the backoff is exponential with
jitter, and a server that is reconnecting is waited for rather than hammered.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import mcp_types as types
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_exponential_jitter

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import ExceededRetries, GatewayError, OutcomeUnknown, UpstreamUnavailable
from gateway.observability import tracing

__all__ = ["Retries"]

logger = logging.getLogger(__name__)

UpstreamEta = Callable[[str], float]
"""Seconds until a server may be connected again (0 when it is, inf when it never will be)."""
WaitReady = Callable[[str, float], Awaitable[None]]
"""Wait up to that many seconds for a server to be connected."""


class Retries:
    """The retry middleware."""

    def __init__(
        self,
        attempts: int,
        max_seconds: float,
        eta: UpstreamEta,
        wait_ready: WaitReady,
        *,
        initial_wait: float = 0.2,
        max_wait: float = 2.0,
    ) -> None:
        self.attempts, self.max_seconds = attempts, max_seconds
        self.eta, self.wait_ready = eta, wait_ready
        self.initial_wait, self.max_wait = initial_wait, max_wait

    def retryable(self, call: ToolCall, exc: BaseException, elapsed: float) -> bool:
        if not isinstance(exc, UpstreamUnavailable):
            return False
        if exc.sent and not call.idempotent:
            return False
        return self.eta(call.server) < self.max_seconds - elapsed

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        started = time.monotonic()
        try:  # the first attempt runs bare: tenacity's machinery is only paid for by failures
            with tracing.span("gateway.attempt", {"mcp_gateway.attempt": 1}):  # nothing while tracing is off
                return await call_next(call)
        except GatewayError as exc:
            if self.attempts < 2 or not self.retryable(call, exc, time.monotonic() - started):
                unknown = _outcome_unknown(call, exc, 1)
                if unknown is not None:
                    raise unknown from None
                raise
            return await self._retry(call, call_next, started, exc)

    async def _retry(
        self, call: ToolCall, call_next: CallHandler, started: float, first: GatewayError
    ) -> types.CallToolResult:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.attempts - 1) | stop_after_delay(self.max_seconds),
            wait=wait_exponential_jitter(multiplier=self.initial_wait, max=self.max_wait),
            retry=retry_if_exception(lambda exc: self.retryable(call, exc, time.monotonic() - started)),
            reraise=True,
        )
        last, tries = first, 1
        try:
            async for attempt in retrying:
                with attempt:
                    tries += 1
                    remaining = self.max_seconds - (time.monotonic() - started)
                    logger.info("retrying %r on %r (attempt %d): %s", call.name, call.server, tries, last)
                    await self.wait_ready(call.server, max(0.0, remaining))
                    try:
                        with tracing.span("gateway.attempt", {"mcp_gateway.attempt": tries}):
                            return await call_next(call)
                    except GatewayError as exc:
                        last = exc
                        raise
        except GatewayError as exc:
            unknown = _outcome_unknown(call, exc, tries)
            if unknown is not None:
                raise unknown from None
            raise ExceededRetries(
                f"Gave up on {call.name!r} after {tries} attempts in {time.monotonic() - started:.1f} s. "
                f"Last error: {exc.message}",
                server=call.server,
                sent=exc.sent,
                details={"attempts": tries, "last_code": exc.code},
            ) from None
        raise AssertionError("unreachable: tenacity either returns, or raises with reraise=True")


def _outcome_unknown(call: ToolCall, exc: GatewayError, attempts: int) -> OutcomeUnknown | None:
    """For a non-idempotent call lost after it was sent: the error that says it may have run."""
    if not isinstance(exc, UpstreamUnavailable) or isinstance(exc, OutcomeUnknown) or not exc.sent:
        return None
    if call.idempotent:
        return None
    return OutcomeUnknown(
        f"Server {call.server!r} failed after {call.name!r} was sent to it, so the call may or may not "
        "have run. It was not retried, because the tool is not marked as safe to repeat. Check "
        "whether its effect happened (read the state it changes) before calling it again.",
        server=call.server,
        sent=True,
        details={"attempts": attempts, "cause": exc.message},
    )
