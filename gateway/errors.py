"""Errors the gateway makes itself, and how they reach a model.

    GatewayError                      base of every error raised by gateway code
    ├── ToolNotFound                  no tool, prompt or resource by that name  -> tool_not_found
    ├── ToolWithheld                  withheld by tool vetting until an operator approves it -> tool_withheld
    ├── TaskRequired                  the tool runs only as an MCP task; the client has no task support
    ├── InvalidArguments              arguments that do not fit the tool        -> invalid_arguments
    ├── UpstreamUnavailable           the server is not connected (failed, stopped, died)
    │   └── OutcomeUnknown            it died after the request was sent, and the call was not retried
    ├── UpstreamTimeout               the server did not answer within its timeout
    ├── UpstreamUnauthorized          the server refused the gateway's credentials
    ├── CircuitOpen                   too many consecutive failures: calls are held back
    ├── ExceededRetries               retried as often as allowed, still failing
    ├── ExecutionError                anything else that went wrong running the call
    ├── RelayRefused                  a server-to-client request the downstream cannot take
    └── SessionLimitReached           (gateway.limits) max_calls_per_session reached -> rate_limited

docs/errors.md lists every code with an example result.

Every code belongs to one class (`error_class`), as HTTP splits 4xx from 5xx, so a caller's
mistakes are never counted against a server: `caller` (the request cannot be served as asked:
an unknown or withheld tool, bad arguments, a limit), `upstream` (the server failed, timed out,
refused the gateway, or answered with an error of its own: `tool_error`, `protocol_error`) and
`gateway` (the gateway itself failed: `execution_error`, `internal_error`, any other code).

`ConfigError` (in `gateway.config.loader`) is separate: it stops the gateway before it starts.

A gateway-made error on `tools/call` becomes a tool result with `isError: true`, one
sentence a model can act on, and `_meta[ERROR_META_KEY]` carrying a machine-readable
`code`. Errors an upstream returned itself pass through unchanged, and protocol errors
(unknown method, bad params) stay JSON-RPC errors.
"""

from __future__ import annotations

import re
from typing import Any, Literal

import mcp_types as types

__all__ = [
    "CALLER_CODES",
    "ERROR_CLASSES",
    "ERROR_META_KEY",
    "UPSTREAM_CODES",
    "ErrorClass",
    "CircuitOpen",
    "ExceededRetries",
    "ExecutionError",
    "GatewayError",
    "InvalidArguments",
    "OutcomeUnknown",
    "RelayRefused",
    "ResultTooLarge",
    "TaskRequired",
    "ToolNotFound",
    "ToolWithheld",
    "UpstreamTimeout",
    "UpstreamUnauthorized",
    "UpstreamUnavailable",
    "error_class",
    "error_result",
    "naming_exposed_tool",
]

ERROR_META_KEY = "mcp-gateway/error"
"""The `_meta` key of a gateway-made error result: `{"code": ..., "server": ...}`."""

ErrorClass = Literal["caller", "upstream", "gateway"]
ERROR_CLASSES: tuple[ErrorClass, ...] = ("caller", "upstream", "gateway")
CALLER_CODES = frozenset(
    {
        "tool_not_found",
        "tool_withheld",
        "task_required",
        "invalid_arguments",
        "relay_refused",
        "rate_limited",
        "cancelled",  # the caller gave up on the call (HTTP's 499)
    }
)
"""The caller's side (HTTP's 4xx): the call could not be served as asked, and no server is at fault."""
UPSTREAM_CODES = frozenset(
    {
        "tool_error",  # the server's own error result
        "protocol_error",  # the server answered with a JSON-RPC error
        "upstream_unavailable",
        "outcome_unknown",
        "upstream_timeout",
        "upstream_unauthorized",
        "result_too_large",
        "circuit_open",
        "exceeded_retries",
    }
)
"""The server's side (HTTP's 502/503/504): it failed, timed out, refused the gateway, or said no."""


def error_class(code: str | None) -> ErrorClass | None:
    """Whose failure an error code is: None for no code (a success), `gateway` for any code not
    known as the caller's or the upstream's (the gateway's own, or a plugin's)."""
    if code is None:
        return None
    if code in CALLER_CODES:
        return "caller"
    if code in UPSTREAM_CODES:
        return "upstream"
    return "gateway"


class GatewayError(Exception):
    """Base class; `code` is the model-facing error code.

    `sent` says whether the request may have reached the upstream: a failure before
    sending is always safe to retry, one after it only for idempotent tools.
    `details` are extra machine-readable fields for `_meta` (never secrets).
    """

    code: str = "execution_error"

    def __init__(
        self, message: str, *, server: str | None = None, sent: bool = False, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.server = server
        self.sent = sent
        self.details = details or {}


class ToolNotFound(GatewayError):
    code = "tool_not_found"


class ToolWithheld(GatewayError):
    """A tool the gateway keeps from clients (`security.tool_changes: block`, `security.injection:
    quarantine`) until an operator approves it with `mcp-gateway tools approve`."""

    code = "tool_withheld"


class TaskRequired(GatewayError):
    """A tool that runs only as an MCP task (`execution.taskSupport: required`), called by a client
    that did not declare task support."""

    code = "task_required"


class InvalidArguments(GatewayError):
    code = "invalid_arguments"


class UpstreamUnavailable(GatewayError):
    code = "upstream_unavailable"


class OutcomeUnknown(UpstreamUnavailable):
    """The connection died after the request was sent, and the tool is not safe to run twice: it may
    have run. A model should check the state the tool changes before calling it again."""

    code = "outcome_unknown"


class UpstreamTimeout(GatewayError):
    code = "upstream_timeout"


class UpstreamUnauthorized(GatewayError):
    code = "upstream_unauthorized"


class ResultTooLarge(GatewayError):
    """A server's answer over `upstreams.max_message_bytes`, dropped while it was read
    (`gateway.upstreams.message_bounds`)."""

    code = "result_too_large"


class CircuitOpen(GatewayError):
    code = "circuit_open"


class ExceededRetries(GatewayError):
    code = "exceeded_retries"


class ExecutionError(GatewayError):
    code = "execution_error"


class RelayRefused(GatewayError):
    code = "relay_refused"


def error_result(error: GatewayError) -> types.CallToolResult:
    """The tool result a model sees for a gateway-made error."""
    meta: dict[str, Any] = {"code": error.code, **error.details}
    if error.server is not None:
        meta["server"] = error.server
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=error.message)],
        is_error=True,
        _meta={ERROR_META_KEY: meta},
    )


def naming_exposed_tool(result: types.CallToolResult, original: str, exposed: str) -> types.CallToolResult:
    """An upstream's error result with its own tool name replaced by the one the model called.

    SDK servers word a failing tool's error as `Error executing tool now: ...` (Python) or
    `Tool now not found` (TypeScript): a model that only knows `clock__now` cannot tell what `now`
    is. Only the name where it follows the word "tool" is replaced, so other uses of a short
    name such as `now` in the text stay as the server wrote them."""
    if not result.is_error or original == exposed:
        return result
    pattern = re.compile(rf"(\btool\s+['\"`]?){re.escape(original)}(?![\w-])", re.IGNORECASE)
    changed = False
    content: list[Any] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            text = pattern.sub(lambda m: m.group(1) + exposed, block.text)
            if text != block.text:
                block, changed = block.model_copy(update={"text": text}), True
        content.append(block)
    return result.model_copy(update={"content": content}) if changed else result
