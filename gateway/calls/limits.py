"""Admission, second layer: what one call and one session may do (`security.limits`).

The calls of a client session are counted (`max_calls_per_session`, refused ones included, as
the caller made them), and a call's arguments are measured (`max_argument_bytes`) before anything
reads them.
"""

from __future__ import annotations

import weakref
from typing import Any

import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall, refuse
from gateway.config.security import LimitsConfig
from gateway.errors import GatewayError
from gateway.security.limits import check_arguments, check_session_calls

__all__ = ["CallLimits"]


class CallLimits:
    """Refuse a call past its session's call budget, or with arguments over the size limit."""

    def __init__(self, limits: LimitsConfig) -> None:
        self.limits = limits
        self._session_calls: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def check(self, call: ToolCall) -> None:
        """Count the call in its session (when sessions have a budget) and measure its arguments."""
        if call.caller is not None:
            try:
                connection = call.caller.connection
                if connection is not None and self.limits.max_calls_per_session is not None:
                    made = self._session_calls[connection] = self._session_calls.get(connection, 0) + 1
                    check_session_calls(made, self.limits)
                check_arguments(call.arguments, self.limits)
            except GatewayError as error:
                raise refuse(call, error) from None

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        self.check(call)  # `chain.compose` calls the check alone (`CheckLayer`)
        return await call_next(call)
