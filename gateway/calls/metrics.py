"""The outermost layer of the call chain: counts every call, its outcome and its time.

Outermost, so the figures are what the client saw: retries are inside one call's time,
and a plugin hook's answer or translated error counts as the call's outcome.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import ERROR_META_KEY, GatewayError, UpstreamTimeout
from gateway.observability.metrics import CallStatus, GatewayMetrics

__all__ = ["CallMetrics", "outcome_of_result"]


def outcome_of_result(result: types.CallToolResult) -> tuple[CallStatus, str | None]:
    """A result's status and error code: a gateway-made error result carries its code in `_meta`,
    any other error result is the server's own (`tool_error`)."""
    if not result.is_error:
        return "success", None
    meta: Any = (result.meta or {}).get(ERROR_META_KEY)
    code = meta.get("code") if isinstance(meta, dict) else None
    if not isinstance(code, str):
        return "error", "tool_error"
    return ("timeout" if code == UpstreamTimeout.code else "error"), code


class CallMetrics:
    """The metrics middleware; records into one gateway's `GatewayMetrics`."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        metrics = self.metrics
        running = metrics.server_children(call.server)[0]
        running.calls += 1
        started = time.perf_counter()
        status: CallStatus = "error"
        code: str | None = "internal_error"
        try:
            result = await call_next(call)
            status, code = outcome_of_result(result)
            return result
        except GatewayError as exc:
            status = "timeout" if isinstance(exc, UpstreamTimeout) else "error"
            code = exc.code
            raise
        except MCPError:
            code = "protocol_error"  # the upstream answered with a JSON-RPC error
            raise
        except anyio.get_cancelled_exc_class():
            status, code = "cancelled", None
            raise
        finally:
            running.calls -= 1
            metrics.observe_call(call.server, call.name, status, code, time.perf_counter() - started)
