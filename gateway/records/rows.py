"""A pending execution as stored rows: status, error code, response summary and size, failures.

Runs on the writer's thread, so the call path pays for none of it; only a record too heavy to
hold in the writer's buffer as it is (`Records`) is turned into rows on the call path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mcp_types as types
from pydantic_core import PydanticSerializationError

from gateway.errors import ERROR_META_KEY, GatewayError, UpstreamTimeout
from gateway.records.cut import cut_text, storable
from gateway.records.model import FailureRow, PendingExecution, ResultDigest, Status
from gateway.records.redaction import Redactor
from gateway.sizes import json_bytes

__all__ = ["TOOL_ERROR", "ResultDigest", "StoredLimits", "digest", "execution_rows", "outcome", "summarize"]

TOOL_ERROR = "tool_error"
"""The error code of an error result the upstream returned itself (the gateway made none)."""
CANCELLED = "cancelled"
"""The error code of a call the client cancelled (or a gateway shutting down ended)."""

ExecutionValues = tuple[Any, ...]
Mask = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class StoredLimits:
    """Most bytes stored of a call's arguments, and of its result's or error's text (`RecordsSettings`)."""

    argument_bytes: int
    result_bytes: int


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
    if result is not None:
        code = _error_code(result)
    elif pending.digest is not None:
        code = pending.digest.error_code
    else:
        return "success", None
    return ("success", None) if code is None else ("error", code)


def _error_code(result: types.CallToolResult) -> str | None:
    """None for a result that is not an error; else its code: the gateway's, in `_meta`, or `tool_error`."""
    if not result.is_error:
        return None
    made = (result.meta or {}).get(ERROR_META_KEY)
    code = made.get("code") if isinstance(made, dict) else None
    return code if isinstance(code, str) else TOOL_ERROR


def digest(result: types.CallToolResult, limit: int) -> ResultDigest:
    """The digest of `result` for a summary of at most `limit` bytes: its texts read only as far as that."""
    parts: list[str] = []
    last_chars = None
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
        if length + len(part) > limit:
            last_chars = limit - length + 1
            break
        length += len(part) + 1
    structured = result.structured_content if not parts else None
    return ResultDigest(tuple(parts), last_chars, structured, _result_bytes(result), _error_code(result))


def summarize(result: types.CallToolResult, limit: int, mask: Mask) -> str:
    """The result's text (other blocks as one-word placeholders, or its structured content as JSON when it
    has no blocks), masked, within `limit` bytes: read only as far as that (`gateway.records.cut`)."""
    return digest(result, limit).summary(limit, mask)


def _failure(pending: PendingExecution, seq: int, attempt: int, error: BaseException, cut: Mask) -> FailureRow:
    code = error.code if isinstance(error, GatewayError) else CANCELLED
    details = error.message if isinstance(error, GatewayError) else (str(error) or type(error).__name__)
    return FailureRow(pending.id, seq, attempt, type(error).__name__, code, cut(details))


def execution_rows(
    pending: PendingExecution, redactor: Redactor, mask: Mask, limits: StoredLimits
) -> tuple[ExecutionValues, list[FailureRow]]:
    """The `executions` row (in `store.EXECUTION_COLUMNS` order) and its `failures` rows, every text
    masked, within its limit and storable (`cut.storable`: a lone surrogate escaped, which may take it up
    to twice its limit)."""
    status, code = outcome(pending)
    summary, size = None, None

    def cut(text: str) -> str:
        return cut_text(text, limits.result_bytes, mask)

    taken = pending.digest
    if pending.result is not None:
        taken = digest(pending.result, limits.result_bytes)
    if taken is not None:
        summary = taken.summary(limits.result_bytes, mask)
        size = taken.size
    elif pending.error is not None:
        error = pending.error
        summary = cut(error.message if isinstance(error, GatewayError) else type(error).__name__)
    failures = [
        _failure(pending, seq, attempt, error, cut) for seq, (attempt, error) in enumerate(pending.attempt_errors)
    ]
    final = pending.error
    if final is not None and not any(error is final for _, error in pending.attempt_errors):
        failures.append(_failure(pending, len(failures), pending.attempts, final, cut))
    elif final is None and status == "error" and taken is not None:
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
        mask(pending.stored_arguments)
        if pending.stored_arguments is not None
        else redactor.arguments_json(pending.arguments, mask, limits.argument_bytes),
        summary,
        size,
        round(pending.latency_ms, 3),
        status,
        code,
        pending.attempts,
        pending.search_id,
        pending.trace_id,
        pending.parent_id,
    )
    return storable_values(values), [storable_failure(failure) for failure in failures]


def _result_bytes(result: types.CallToolResult) -> int:
    """The result's size as JSON; a lone surrogate (which pydantic's serializer refuses) counted as 3 bytes."""
    try:  # `model_dump_json`'s bytes, not decoded to be encoded again
        return len(result.__pydantic_serializer__.to_json(result, by_alias=True, exclude_none=True))
    except PydanticSerializationError:
        return json_bytes(result.model_dump(by_alias=True, mode="json", exclude_none=True))


def storable_values(values: tuple[Any, ...]) -> tuple[Any, ...]:
    """A row's texts made storable (`cut.storable`), its other values as they are: the row itself when every
    text is ASCII without a NUL already (nearly always; no new tuple)."""
    for value in values:
        if isinstance(value, str) and not (value.isascii() and "\x00" not in value):
            return tuple(storable(value) if isinstance(value, str) else value for value in values)
    return values


def storable_failure(row: FailureRow) -> FailureRow:
    return FailureRow(
        row.execution_id, row.seq, row.attempt, storable(row.error_type), storable(row.code), storable(row.details)
    )
