"""Code mode's two tools behind the serving layer: `describe_tools` and `execute`.

`execute` runs one program in the sandbox (`gateway.codemode.sandbox`) with the tools its caller
may see (`gateway.codemode.program_api`), under the write gate, and turns the run into the result
the model reads (`gateway.codemode.report`). With records on, the run is an execution of its own
(server `gateway`, tool `execute`, the program as its argument) and every inner call's record
names it as its parent (`parent_id`), so the records and the console show a run with its calls.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

import anyio.abc
import mcp_types as types

from gateway.codemode.program_api import CallTool, ProgramTools
from gateway.codemode.report import program_result
from gateway.codemode.sandbox import RunOutcome, SandboxPool
from gateway.codemode.signatures import signature
from gateway.codemode.write_gate import ConfirmWrites, RunWrites, WriteGate, read_only
from gateway.config.routing_settings import CodeModeSettings

__all__ = ["MAX_DESCRIBE", "MAX_PROGRAM_BYTES", "CodeArgumentError", "CodeMode", "parse_names", "parse_program"]

MAX_PROGRAM_BYTES = 100_000
MAX_DESCRIBE = 50


class CodeArgumentError(ValueError):
    """`execute` or `describe_tools` was called with bad arguments; the message names the parameter."""


def parse_program(arguments: Mapping[str, Any] | None) -> str:
    """The `code` argument of `execute`: a non-empty string of at most `MAX_PROGRAM_BYTES`."""
    arguments = arguments or {}
    code = arguments.get("code")
    if not isinstance(code, str) or not code.strip():
        raise CodeArgumentError("execute needs `code`: a non-empty Python program as a string.")
    if len(code.encode("utf-8")) > MAX_PROGRAM_BYTES:
        raise CodeArgumentError(f"execute `code` is over {MAX_PROGRAM_BYTES} bytes; write a shorter program.")
    unknown = sorted(set(arguments) - {"code"})
    if unknown:
        raise CodeArgumentError(f"execute takes `code` only; unknown argument(s): {', '.join(unknown)}.")
    return code


def parse_names(arguments: Mapping[str, Any] | None) -> list[str]:
    """The `names` argument of `describe_tools`: 1 to `MAX_DESCRIBE` tool names."""
    names = (arguments or {}).get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise CodeArgumentError("describe_tools needs `names`: a list of tool names, as search_tools gave them.")
    if len(names) > MAX_DESCRIBE:
        raise CodeArgumentError(f"describe_tools takes at most {MAX_DESCRIBE} names; got {len(names)}.")
    return list(dict.fromkeys(names))


class CodeMode:
    """The sandbox pool and the write gate of one gateway; `execute` and `describe`."""

    def __init__(self, settings: CodeModeSettings, task_group: Callable[[], anyio.abc.TaskGroup]) -> None:
        self.settings = settings
        self.sandbox = SandboxPool(settings, task_group)
        self.gate = WriteGate(settings.allow_writes)

    def describe(self, names: list[str], offered: Mapping[str, types.Tool]) -> types.CallToolResult:
        """Typed signatures of the named tools the caller may see; an unknown or hidden name is said to be unknown."""
        found = [signature(name, offered[name]) for name in names if name in offered]
        missing = [name for name in names if name not in offered]
        gated = [name for name in names if name in offered and self.gate.refusal(name, offered[name]) is not None]
        parts = found[:]
        if missing:
            parts.append(f"# no tool named: {', '.join(missing)} (search_tools finds tools by task)")
        if gated:
            parts.append(f"# not callable from a program (not read-only, not allowed): {', '.join(gated)}")
        return types.CallToolResult(
            content=[types.TextContent(type="text", text="\n\n".join(parts))],
            structured_content={
                "signatures": {name: signature(name, offered[name]) for name in names if name in offered},
                "unknown": missing,
                "read_only": {name: read_only(offered[name]) for name in names if name in offered},
            },
        )

    async def execute(
        self,
        code: str,
        offered: Mapping[str, types.Tool],
        call: CallTool,
        *,
        confirm: ConfirmWrites | None = None,
    ) -> tuple[types.CallToolResult, RunOutcome]:
        """Run `code` with `offered` as its tools, `call` running each inner call, `confirm` asking the
        client once whether the run may call write tools (None: it cannot be asked); the model's
        result and the run."""
        confirm_writes = self.settings.confirm_writes
        writes = RunWrites(self.gate, confirm if confirm_writes else None, confirm_writes=confirm_writes)
        tools = ProgramTools(offered, call, writes, self.settings.max_tool_calls)
        outcome = await self.sandbox.run(code, tools)
        return program_result(outcome, self.settings.max_output_bytes), outcome

    @staticmethod
    def new_run_id() -> str:
        """An execution id for a run (the parent id of its inner calls' records)."""
        return uuid.uuid4().hex
