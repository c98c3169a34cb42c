"""Errors the gateway makes itself, and how they reach a model.

    GatewayError                      base of every error raised by gateway code
    ├── ToolNotFound                  no tool, prompt or resource by that name  -> tool_not_found
    ├── InvalidArguments              arguments that do not fit the tool        -> invalid_arguments
    ├── UpstreamUnavailable           the server is not connected (failed, stopped, died)
    ├── UpstreamTimeout               the server did not answer within its timeout
    └── RelayRefused                  a server-to-client request the downstream cannot take

`ConfigError` (in `gateway.config`) is separate: it stops the gateway before it starts.

A gateway-made error on `tools/call` becomes a tool result with `isError: true`, one
sentence a model can act on, and `_meta[ERROR_META_KEY]` carrying a machine-readable
`code`. Errors an upstream returned itself pass through unchanged, and protocol errors
(unknown method, bad params) stay JSON-RPC errors.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types

__all__ = [
    "ERROR_META_KEY",
    "GatewayError",
    "InvalidArguments",
    "RelayRefused",
    "ToolNotFound",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "error_result",
]

ERROR_META_KEY = "mcp-gateway/error"
"""The `_meta` key of a gateway-made error result: `{"code": ..., "server": ...}`."""


class GatewayError(Exception):
    """Base class; `code` is the model-facing error code."""

    code: str = "execution_error"

    def __init__(self, message: str, *, server: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.server = server


class ToolNotFound(GatewayError):
    code = "tool_not_found"


class InvalidArguments(GatewayError):
    code = "invalid_arguments"


class UpstreamUnavailable(GatewayError):
    code = "upstream_unavailable"


class UpstreamTimeout(GatewayError):
    code = "upstream_timeout"


class RelayRefused(GatewayError):
    code = "relay_refused"


def error_result(error: GatewayError) -> types.CallToolResult:
    """The tool result a model sees for a gateway-made error."""
    meta: dict[str, Any] = {"code": error.code}
    if error.server is not None:
        meta["server"] = error.server
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=error.message)],
        is_error=True,
        _meta={ERROR_META_KEY: meta},
    )
