"""A pending execution as stored rows: status, error code, response summary and size, failures.

Runs on the writer's thread, so the call path pays for none of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types

from gateway.errors import ERROR_META_KEY, GatewayError, UpstreamTimeout
from gateway.records.model import FailureRow, PendingExecution, Status
from gateway.records.redaction import Redactor

__all__ = ["SUMMARY_CHARS", "TOOL_ERROR", "execution_rows", "outcome", "summarize"]

SUMMARY_CHARS = 500
"""The response summary keeps this many characters of the result's text."""
TOOL_ERROR = "tool_error"
"""The error code of an error result the upstream returned itself (the gateway made none)."""
CANCELLED = "cancelled"
"""The error code of a call the client cancelled (or a gateway shutting down ended)."""

ExecutionValues = tuple[Any, ...]


def outcome(pending: PendingExecution) -> tuple[Status, str | None]:
    """The execution's status and error code."""
    error = pending.error
    if isinstance(error, UpstreamTimeout):
        return "timeout", error.code
    if isinstance(error, GatewayError):
        return "error", error.code
    if error is not None:
        return "error", CANCELLED
    result = pending.result
    if result is not None and result.is_error:
        made = (result.meta or {}).get(ERROR_META_KEY)
        code = made.get("code") if isinstance(made, dict) else None
        return "error", code if isinstance(code, str) else TOOL_ERROR
    return "success", None


def summarize(result: types.CallToolResult) -> str:
    """The result's text (other blocks as one-word placeholders), cut to `SUMMARY_CHARS`."""
    parts: list[str] = []
    length = 0
    for block in result.content:
        if isinstance(block, types.TextContent):
            part = block.text
        elif isinstance(block, types.ResourceLink | types.EmbeddedResource):
            uri = block.uri if isinstance(block, types.ResourceLink) else block.resource.uri
            part = f"[{block.type} {uri}]"
        else:
            part = f"[{block.type}]"
        parts.append(part)
        length += len(part)
        if length >= SUMMARY_CHARS:
            break
    if not parts and result.structured_content is not None:
        parts.append(str(result.structured_content))
    text = "\n".join(parts)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def _failure(
    pending: PendingExecution, seq: int, attempt: int, error: BaseException, mask: Callable[[str], str]
) -> FailureRow:
    code = error.code if isinstance(error, GatewayError) else CANCELLED
    details = error.message if isinstance(error, GatewayError) else (str(error) or type(error).__name__)
    return FailureRow(pending.id, seq, attempt, type(error).__name__, code, mask(details))


def execution_rows(
    pending: PendingExecution, redactor: Redactor, mask: Callable[[str], str]
) -> tuple[ExecutionValues, list[FailureRow]]:
    """The `executions` row (in `store.EXECUTION_COLUMNS` order) and its `failures` rows."""
    status, code = outcome(pending)
    summary, size = None, None
    if pending.result is not None:
        summary = mask(summarize(pending.result))
        size = len(pending.result.model_dump_json(by_alias=True, exclude_none=True).encode("utf-8"))
    elif pending.error is not None:
        summary = mask(
            pending.error.message if isinstance(pending.error, GatewayError) else type(pending.error).__name__
        )
    failures = [
        _failure(pending, seq, attempt, error, mask) for seq, (attempt, error) in enumerate(pending.attempt_errors)
    ]
    final = pending.error
    if final is not None and not any(error is final for _, error in pending.attempt_errors):
        failures.append(_failure(pending, len(failures), pending.attempts, final, mask))
    elif final is None and status == "error" and pending.result is not None:
        failures.append(
            FailureRow(pending.id, len(failures), pending.attempts, "ErrorResult", code or TOOL_ERROR, summary or "")
        )
    values = (
        pending.id,
        pending.at,
        pending.server,
        pending.tool,
        pending.session_id,
        pending.client_id,
        redactor.arguments_json(pending.arguments, mask),
        summary,
        size,
        round(pending.latency_ms, 3),
        status,
        code,
        pending.attempts,
        pending.search_id,
    )
    return values, failures
