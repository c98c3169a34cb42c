"""What the gateway changes in requests and results on their way through it.

Requests keep the client's `_meta` (minus what belongs to one hop; progress goes to the
client's current request, `gateway.relay.progress_forwarder`); results have their
resource URIs rewritten to the exposed form (`prefix+uri`), so a client can read back
what a tool linked to. An upstream's JSON-RPC errors keep their code and say what the
client asked for (`relayed_error`).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Any, cast

import mcp_types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.catalog import expose_uri
from gateway.errors import GatewayError
from gateway.relay import connection_of

__all__ = [
    "as_protocol_error",
    "expose_block",
    "expose_result_uris",
    "forwarded_meta",
    "relayed_error",
    "rename_contents",
]

_RESERVED_META_PREFIX = "io.modelcontextprotocol/"
_MCP_ERROR_PREFIX = re.compile(r"^(?:MCP error -?\d+:\s*)+")
"""What the TypeScript SDK puts before an error's message; its clients add it again."""


def forwarded_meta(ctx: ServerRequestContext[Any, Any]) -> types.RequestParamsMeta | None:
    """The downstream request's `_meta` minus what the SDK manages per hop, plus a log opt-in.

    The progress token and the protocol envelope keys belong to one connection; the
    SDK sets its own on the upstream request. A 2026-07-28 upstream sends log messages
    only for requests that opt in, so the gateway opts in at the level the client
    asked for: its own opt-in on 2026-07-28, its `logging/setLevel` (default: every
    level) on the handshake era.
    """
    forwarded = {
        k: v
        for k, v in dict(ctx.meta or {}).items()
        if k not in ("progressToken", "progress_token") and not k.startswith(_RESERVED_META_PREFIX)
    }
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        level = (ctx.meta or {}).get(types.LOG_LEVEL_META_KEY)
    else:
        connection = connection_of(ctx)
        level = connection.state.get("log_level", "debug") if connection is not None else "debug"
    if level is not None:
        forwarded[types.LOG_LEVEL_META_KEY] = level
    return cast(types.RequestParamsMeta, forwarded) if forwarded else None


def rename_contents(
    result: types.ReadResourceResult, original: str, requested: str, prefix: str
) -> types.ReadResourceResult:
    """Contents carry the URI the client asked for (or, for sub-resources, their exposed URI)."""
    contents = [
        c.model_copy(update={"uri": requested if c.uri == original else expose_uri(prefix, c.uri)})
        for c in result.contents
    ]
    return result.model_copy(update={"contents": contents})


def expose_block(block: Any, prefix: str) -> Any:
    """A content block whose resource URI (link or embedded) is the one clients can read back."""
    if not prefix:
        return block
    if isinstance(block, types.ResourceLink):
        return block.model_copy(update={"uri": expose_uri(prefix, block.uri)})
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource.model_copy(update={"uri": expose_uri(prefix, block.resource.uri)})
        return block.model_copy(update={"resource": resource})
    return block


def expose_result_uris(result: Any, prefix: str) -> Any:
    """Rewrite resource URIs in a tool result, so `resources/read` on them reaches the right server."""
    if not isinstance(result, types.CallToolResult) or not prefix:
        return result
    if not any(isinstance(b, types.ResourceLink | types.EmbeddedResource) for b in result.content):
        return result
    return result.model_copy(update={"content": [expose_block(b, prefix) for b in result.content]})


def relayed_error(exc: MCPError, renamed: tuple[str, str] | None = None) -> MCPError:
    """An upstream's JSON-RPC error as the client should see it.

    The message loses the `MCP error <code>: ` prefix a TypeScript server writes into it:
    the code travels in the error itself, and a client that prints it adds the prefix
    again (`MCP error -32602: MCP error -32602: ...`). With `renamed` (upstream URI,
    exposed URI), the message and `data.uri` name the URI the client sent.
    """
    message, data = _MCP_ERROR_PREFIX.sub("", exc.message) or exc.message, exc.data
    if renamed is not None:
        original, exposed = renamed
        message = message.replace(original, exposed) if original != exposed else message
        if isinstance(data, dict) and data.get("uri") == original:
            data = {**data, "uri": exposed}
    if (message, data) == (exc.message, exc.data):
        return exc
    return MCPError(exc.code, message, data)


async def as_protocol_error(awaitable: Awaitable[Any], renamed: tuple[str, str] | None = None) -> Any:
    """Outside tools/call there is no error result: gateway errors become JSON-RPC errors, and the
    upstream's own pass as `relayed_error`s (`renamed`: its URI and the one the client sent)."""
    try:
        return await awaitable
    except MCPError as exc:
        raise relayed_error(exc, renamed) from None
    except GatewayError as exc:
        raise MCPError(types.INTERNAL_ERROR, exc.message, {"code": exc.code, "server": exc.server}) from None
