"""Admission, last layer: a call goes on only for a tool that resolved and that its client can run.

A name that did not resolve (its server is down and was never listed, vetting withholds the tool,
no such tool) is refused with the reason the registry found. A tool that requires MCP tasks is
refused, as `task_required`, to a client that cannot run tasks. Calls the gateway makes itself
(no caller) are refused only for the first reason.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

from gateway.calls.chain import Caller, CallHandler, ToolCall, refuse
from gateway.errors import TaskRequired

__all__ = ["admitted", "runnable", "unresolved_call"]


def unresolved_call(
    name: str,
    server: str,
    arguments: dict[str, Any] | None,
    error: Exception,
    *,
    notes: dict[str, Any] | None,
    caller: Caller | None,
) -> ToolCall:
    """The call of a name that did not resolve to a tool, carrying why (`error`): `runnable` refuses
    it, so it is recorded as every refused call is. `server` is the owner's id, or ""."""

    async def never_sent(args: dict[str, Any] | None) -> types.CallToolResult:
        raise error

    return ToolCall(
        server=server,
        name=name,
        original=name,
        tool=types.Tool(name=name, input_schema={"type": "object"}),
        arguments=arguments,
        send=never_sent,
        timeout=0.0,
        idempotent=False,
        notes=notes if notes is not None else {},
        caller=caller,
        unresolved=error,
    )


async def admitted(call: ToolCall) -> types.CallToolResult:
    """The innermost handler when only the admission layers run (`Registry.admit`): nothing is sent."""
    return types.CallToolResult(content=[])


class _Runnable:
    """The middleware: refuse a call that did not resolve, or that its client cannot run."""

    def check(self, call: ToolCall) -> None:
        if call.unresolved is not None:
            raise refuse(call, call.unresolved)
        if call.caller is not None and not call.caller.can_run(call.tool):
            raise refuse(
                call,
                TaskRequired(
                    f"Tool {call.name!r} runs only as an MCP task (execution.taskSupport: required), and this client "
                    "did not declare task support (the `tasks` capability, protocol 2025-11-25) or this gateway "
                    "cannot keep tasks for it (stateless HTTP). Use a client that supports tasks, or another tool."
                ),
            )

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        self.check(call)  # `chain.compose` calls the check alone (`CheckLayer`)
        return await call_next(call)


runnable = _Runnable()
"""The middleware (a `chain.CheckLayer`)."""
