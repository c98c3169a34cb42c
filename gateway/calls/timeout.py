"""The per-call deadline. Expiring it cancels the request, which the SDK turns into a
`notifications/cancelled` to the upstream, so a hung tool does not keep working for nobody."""

from __future__ import annotations

import time

import anyio
import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import UpstreamTimeout
from gateway.observability import tracing

__all__ = ["apply_timeout"]


async def apply_timeout(call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
    """Run the rest of the chain within `call.timeout` seconds, else raise `upstream_timeout`."""
    started_ns = time.time_ns()
    # A bare cancel scope, not `fail_after` (two generator context managers around the same scope): only
    # its deadline cancels it, so a block that does not return here was cut by the deadline. A
    # `TimeoutError` from inside counts as the deadline's, as it did under `fail_after`.
    try:
        with anyio.CancelScope(deadline=anyio.current_time() + call.timeout):
            return await call_next(call)
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
