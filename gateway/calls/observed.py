"""The outermost call-chain layer while tracing or JSON logs are on: what a call is, told to its
trace and to its log lines.

It adds the call's attributes to the current span (the SDK's SERVER span of the `tools/call`,
or a span of its own when no span surrounds the call) and names the server and tool in the
log lines written meanwhile (`gateway.observability.logs.call_context`). The spans of the layers
that do work (validation, each attempt, a breaker's refusal, a timeout) are made by those layers
through `gateway.observability.tracing`; this layer is not in the chain when both are off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import GatewayError
from gateway.observability import tracing
from gateway.observability.logs import call_context
from gateway.sizes import utf8_bytes

__all__ = ["ArgumentsForSpan", "ObservedCalls", "result_text_bytes"]

ArgumentsForSpan = Callable[[str, dict[str, Any] | None], str | None]
"""`(server id, arguments) -> redacted JSON` for the span, as the records store them."""

_SESSION_NOTE = "session_id"
"""The `ToolCall.notes` key the server sets with the client's session id (`gateway.records.recorder.SESSION_NOTE`;
not imported, as the records import this package)."""
_EXECUTION_NOTE = "execution_id"
"""Where the recorder leaves the execution id (`gateway.records.model.EXECUTION_ID_NOTE`)."""


class ObservedCalls:
    """The observing middleware. `arguments`: put the redacted arguments on the span (None: never)."""

    def __init__(self, arguments: ArgumentsForSpan | None = None) -> None:
        self.arguments = arguments

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        with call_context(call.server, call.name), tracing.start_root(f"tools/call {call.name}"):
            span = tracing.current_span()
            if span is None:
                return await call_next(call)
            # Gathered, then set at once: each `set_attribute` takes the span's lock and checks the value.
            attributes: dict[str, Any] = {
                "mcp.method.name": "tools/call",
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "mcp_gateway.server.id": call.server,
                "mcp_gateway.tool.exposed_name": call.name,
                "mcp_gateway.tool.upstream_name": call.original,
            }
            session = call.notes.get(_SESSION_NOTE)
            if session is not None:
                attributes["mcp.session.id"] = session
            if self.arguments is not None:
                stored = self.arguments(call.server, call.arguments)
                if stored is not None:
                    attributes["gen_ai.tool.call.arguments"] = stored
            try:
                result = await call_next(call)
                attributes["mcp_gateway.result.size"] = result_text_bytes(result)
                if result.is_error:
                    attributes["mcp_gateway.error.code"] = "tool_error"
                return result
            except GatewayError as error:
                attributes["mcp_gateway.error.code"] = error.code
                raise
            finally:
                attributes["mcp_gateway.attempts"] = call.attempts
                execution = call.notes.get(_EXECUTION_NOTE)
                if execution is not None:
                    attributes["mcp_gateway.execution.id"] = execution
                span.set_attributes(attributes)


def result_text_bytes(result: types.CallToolResult) -> int:
    """The UTF-8 bytes of a result's text blocks: a cheap size (the records measure the whole JSON)."""
    return sum(utf8_bytes(block.text) for block in result.content if isinstance(block, types.TextContent))
