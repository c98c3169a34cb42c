"""What the model gets back from `execute`: the return value and the printed output, each cut at
`max_output_bytes` with a note; on error, the exception, the program's line, the inner call that
failed and the limit that was hit, by name.

The text is what a model reads; `structuredContent` carries the same facts as fields.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from gateway.codemode.sandbox import RunOutcome
from gateway.errors import ERROR_META_KEY
from gateway.sizes import cut_bytes, utf8_bytes

__all__ = ["PROGRAM_ERROR", "PROGRAM_LIMIT", "jsonable", "program_result"]

PROGRAM_ERROR = "program_error"
"""The `_meta` error code of a program that raised (syntax, an uncaught exception, a crashed worker)."""
PROGRAM_LIMIT = "program_limit"
"""The `_meta` error code of a program stopped by one of its limits."""


def jsonable(value: Any) -> Any:
    """The program's return value as JSON data (tuples as lists, anything else by its repr)."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=repr))


def _cut(text: str, limit: int, what: str) -> tuple[str, str | None]:
    size = utf8_bytes(text)
    if size <= limit:
        return text, None
    return cut_bytes(text, limit), (
        f"[{what} cut from {size} to {limit} bytes: output size limit (GATEWAY_CODEMODE__MAX_OUTPUT_BYTES); "
        "return less, e.g. a summary or the first items]"
    )


def program_result(outcome: RunOutcome, max_output_bytes: int) -> types.CallToolResult:
    """The `execute` result for one run."""
    tools = outcome.tools
    calls = len(tools.calls) if tools is not None else 0
    parts: list[str] = []
    structured: dict[str, Any] = {"ok": outcome.error is None, "tool_calls": calls}
    notes: list[str] = []
    if outcome.error is None:
        value = jsonable(outcome.value)
        text, note = _cut(json.dumps(value, ensure_ascii=False), max_output_bytes, "return value")
        parts.append(text)
        structured["result"] = value if note is None else text
        notes += [note] if note else []
    else:
        error = outcome.error
        where = f" at line {error.line}" + (f": {error.source}" if error.source else "") if error.line else ""
        parts.append(f"The program failed{where}\n{error.type}: {error.message}")
        failed = tools.failed if tools is not None else None
        detail: dict[str, Any] = {"type": error.type, "message": error.message, "line": error.line}
        if failed is not None and failed.error is not None and failed.error in error.message:
            parts.append(f"The inner call that failed: call {failed.number}, {failed.name}")
            detail["failed_call"] = {"number": failed.number, "tool": failed.name, "error": failed.error}
        if error.limit is not None:
            parts.append(f"Limit hit: {error.limit}")
            detail["limit"] = error.limit
        structured["error"] = detail
    if outcome.output or outcome.output_dropped:
        output, note = _cut(outcome.output, max_output_bytes, "printed output")
        parts.append("Printed output:\n" + output)
        structured["output"] = output
        if outcome.output_dropped:
            note = (
                f"[printed output cut: {outcome.output_dropped} more bytes not kept, output size limit "
                "(GATEWAY_CODEMODE__MAX_OUTPUT_BYTES)]"
            )
        notes += [note] if note else []
    if notes:
        structured["notes"] = notes
    text = "\n".join(parts + notes)
    meta: dict[str, Any] | None = None
    if outcome.error is not None:
        code = PROGRAM_LIMIT if outcome.error.limit is not None else PROGRAM_ERROR
        meta = {ERROR_META_KEY: {"code": code, **({"limit": outcome.error.limit} if outcome.error.limit else {})}}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=structured,
        is_error=outcome.error is not None,
        _meta=meta,
    )
