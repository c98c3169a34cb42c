"""What the records hold: one dataclass per row kind, as the call path hands it to the writer.

An execution is captured raw on the call path (references to the arguments, the
result or the error) and turned into rows by the writer's thread: redaction, the
response summary and its size cost nothing on the call itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import mcp_types as types

from gateway.records.cut import cut_text, shrink

__all__ = [
    "EXECUTION_ID_NOTE",
    "PARENT_NOTE",
    "FEEDBACK_TOKEN_META_KEY",
    "ExecutionRef",
    "FailureRow",
    "FeedbackRow",
    "PendingExecution",
    "ResultDigest",
    "SearchRow",
    "Status",
]

Status = Literal["success", "error", "timeout"]

FEEDBACK_TOKEN_META_KEY = "mcp-gateway/feedback_token"
"""The `_meta` key of every proxied tool result: the execution id, to rate the result with."""
EXECUTION_ID_NOTE = "execution_id"
"""The `ToolCall.notes` key where the recorder leaves the execution id for the server."""
PARENT_NOTE = "parent_id"
"""The `ToolCall.notes` key of the execution a call was made from: a code-mode program's run."""


@dataclass(slots=True)
class ResultDigest:
    """What the rows need of a call's result, taken on the call path (`digest`) so that the writer's buffer
    holds a few strings instead of the result's objects: a buffered result is a dozen objects the garbage
    collector walks again and again until the flush (most of what records cost a call, measured).
    The texts are kept unmasked and uncut: masking and cutting stay on the writer's thread."""

    parts: tuple[str, ...]
    """The summary's texts as `summarize` takes them (other blocks as placeholders), unmasked."""
    last_chars: int | None
    """The last part is masked, then sliced to this many characters (None: taken whole)."""
    structured: Any
    """The structured content, when the result has no blocks to summarize (else None)."""
    size: int
    """The result's size as JSON (`_result_bytes`)."""
    error_code: str | None
    """None: not an error result; else its code (`_error_code`)."""

    def summary(self, limit: int, mask: Callable[[str], str]) -> str:
        """`summarize`'s text for the result this digests."""
        parts = list(self.parts)
        if self.last_chars is not None:
            parts[-1] = mask(parts[-1])[: self.last_chars]  # masked before the slice: it cannot split a secret
        if not parts and self.structured is not None:
            shrunk, _ = shrink(self.structured, limit + 1, lambda key: False, mask)
            parts.append(json.dumps(shrunk, ensure_ascii=False, separators=(",", ":"), default=str))
        return cut_text("\n".join(parts), limit, mask)


@dataclass(slots=True)
class PendingExecution:
    """One proxied call as the recorder saw it; `result` or `error` is set."""

    id: str
    at: float
    """Unix seconds when the call started."""
    server: str
    tool: str
    """The exposed name, `prefix__tool`."""
    session_id: str | None
    client_id: str | None
    arguments: dict[str, Any] | None
    latency_ms: float
    attempts: int
    search_id: str | None
    result: types.CallToolResult | None = None
    error: BaseException | None = None
    attempt_errors: Sequence[tuple[int, BaseException]] = field(default_factory=list)
    """Errors of attempts that failed before the final outcome (retried ones), with their attempt number."""
    stored_arguments: str | None = None
    """What to store instead of `arguments`, made on the call path: a refused call's summary."""
    trace_id: str | None = None
    """The call's OpenTelemetry trace id (32 hex digits) when tracing is on."""
    parent_id: str | None = None
    """The execution this call was made from (a code-mode program's run), None for a client's own call."""
    digest: ResultDigest | None = None
    """What the rows need of `result`, which the writer's buffer holds instead of it (`Records.submit_execution`)."""


@dataclass(frozen=True, slots=True)
class FailureRow:
    execution_id: str
    seq: int
    attempt: int
    error_type: str
    code: str
    details: str


@dataclass(frozen=True, slots=True)
class SearchRow:
    id: str
    at: float
    session_id: str | None
    client_id: str | None
    query: str | None
    results: tuple[str, ...]
    latency_ms: float


@dataclass(frozen=True, slots=True)
class FeedbackRow:
    token: str
    execution_id: str
    at: float
    rating: Literal["up", "down"] | None
    score: int | None
    comment: str | None
    client_id: str | None


@dataclass(frozen=True, slots=True)
class ExecutionRef:
    """What feedback needs to know about the execution it rates."""

    id: str
    server: str
    tool: str
