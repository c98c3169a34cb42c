"""The tool API a program sees: `tools.<name>(**arguments)` and `call_tool(name, arguments)`.

Both are host functions: the sandbox suspends, the worker sends the call over its pipe, and the
gateway runs it here, through `CallTool` (the registry's ordinary call chain, with the caller of
the `execute` call). Only the tools that caller may see are in `tools`; any other name, through
`call_tool`, gets the very refusal an unknown name gets. A result comes back as a Python value:
the structured content when the tool gives one, else its text. A failed call raises an
exception the program can catch: `PermissionError` from the write gate (`RunWrites`), `RuntimeError` for
everything else, its message naming the tool, the error code and the reason. The calls are
counted: past `max_calls` every call raises, and the run ends as failed on that limit even if the
program catches it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mcp_types as types

from gateway.codemode.write_gate import RunWrites
from gateway.errors import GatewayError

if TYPE_CHECKING:
    from pydantic_monty import ExternalModule

__all__ = ["CallTool", "InnerCall", "ProgramTools", "result_value"]

CallTool = Callable[[str, dict[str, Any] | None], Awaitable[types.CallToolResult]]
"""Runs one tool call through the call chain; raises `GatewayError` for a refusal or failure."""

TOOL_CALLS_LIMIT = "tool calls (GATEWAY_CODEMODE__MAX_TOOL_CALLS)"


@dataclass
class InnerCall:
    """One tool call a program made, as the run's report names it."""

    number: int
    """1 for the program's first call."""
    name: str
    error: str | None = None
    """Why it failed (the message the program got), None when it succeeded."""


def result_value(result: types.CallToolResult) -> Any:
    """A tool result as a Python value: its structured content, else its text blocks joined
    (other blocks as a short placeholder naming their type)."""
    if result.structured_content is not None:
        return result.structured_content
    parts = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        else:
            parts.append(f"[{block.type} content]")
    return "\n".join(parts)


def _error_text(result: types.CallToolResult) -> str:
    text = result_value(result) if result.structured_content is None else ""
    if not text:
        text = "\n".join(b.text for b in result.content if isinstance(b, types.TextContent)) or "an error result"
    return str(text)


class ProgramTools:
    """The tools of one program run: what it may call, the calls it made, a limit it hit."""

    def __init__(self, offered: Mapping[str, types.Tool], call: CallTool, writes: RunWrites, max_calls: int) -> None:
        self.offered = dict(offered)
        self.call = call
        self.writes = writes
        self.max_calls = max_calls
        self.calls: list[InnerCall] = []
        self.limit_hit: str | None = None
        """The limit the program reached through its calls, named as the model reads it."""

    @property
    def failed(self) -> InnerCall | None:
        """The last call that failed, if any."""
        return next((call for call in reversed(self.calls) if call.error is not None), None)

    def module(self) -> ExternalModule:
        """The `tools` module: one async function per tool the caller may see."""
        from pydantic_monty import ExternalModule  # with the first program, as `sandbox.SandboxPool` imports it

        return ExternalModule({name: self._function(name) for name in self.offered})

    def _function(self, name: str) -> Callable[..., Awaitable[Any]]:
        async def tool(*args: Any, **arguments: Any) -> Any:
            if args:
                raise TypeError(f"tools.{name} takes keyword arguments only, e.g. tools.{name}(key=value)")
            return await self.call_tool(name, arguments)

        return tool

    async def call_tool(self, name: Any, arguments: Any = None) -> Any:
        """`call_tool(name, arguments)` in the program, and what `tools.<name>` calls."""
        if not isinstance(name, str):
            raise TypeError(f"call_tool's name must be a string; got {type(name).__name__}")
        if arguments is not None and not isinstance(arguments, dict):
            raise TypeError(f"call_tool's arguments must be a dict; got {type(arguments).__name__}")
        if len(self.calls) >= self.max_calls:
            self.limit_hit = TOOL_CALLS_LIMIT
            raise RuntimeError(
                f"tool call limit: this program already made {self.max_calls} tool calls, the most one run may make "
                "(GATEWAY_CODEMODE__MAX_TOOL_CALLS); do the rest in another run, or with fewer calls"
            )
        record = InnerCall(len(self.calls) + 1, name)
        self.calls.append(record)
        tool = self.offered.get(name)
        if tool is not None:
            refusal = await self.writes.refusal(name, tool)
            if refusal is not None:
                record.error = f"{name} refused (write_not_allowed): {refusal}"
                raise PermissionError(record.error)
        try:
            result = await self.call(name, arguments)
        except GatewayError as error:
            record.error = f"{name} refused ({error.code}): {error.message}"
            raise RuntimeError(record.error) from None
        if result.is_error:
            record.error = f"{name} failed: {_error_text(result)}"
            raise RuntimeError(record.error)
        return result_value(result)
