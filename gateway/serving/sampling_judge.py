"""The router's judge asks the client's own model, through MCP sampling (issue 30).

`GATEWAY_SECOND_STAGE__KIND=judge` has an LLM say which of the router's candidates fit a
request (`gateway.router.second_stage`). A client that declares `sampling` already offers
one: the judge's question goes to it as a `sampling/createMessage` request on the
`search_tools` request's own stream, exactly as an upstream's sampling question is relayed.

Only a handshake-era client on a connection that carries server-to-client requests can be
asked this way (stdio, or HTTP with sessions). A 2026-07-28 client answers server questions
only by retrying its request, and stateless HTTP has no session: for them, and for
`POST /route`, the judge uses the chat endpoint when one is configured, else the first
stage's answer stands.
"""

from __future__ import annotations

from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.router.endpoints import EndpointError
from gateway.router.second_stage import Ask

__all__ = ["sampling_ask"]


def sampling_ask(ctx: ServerRequestContext[Any, Any] | None) -> Ask | None:
    """The client's model as the judge's `Ask`, or None when this client cannot be asked."""
    if ctx is None or ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None
    caps = ctx.session.client_capabilities
    if caps is None or caps.sampling is None or not ctx.session.can_send_request:
        return None

    async def ask(system: str, user: str, max_tokens: int) -> str:
        request = types.CreateMessageRequest(
            params=types.CreateMessageRequestParams(
                messages=[types.SamplingMessage(role="user", content=types.TextContent(type="text", text=user))],
                system_prompt=system,
                max_tokens=max_tokens,
                temperature=0,
                include_context="none",
            )
        )
        try:
            result = await ctx.session.send_request(
                request, types.CreateMessageResult, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
            )
        except MCPError as exc:  # the client refused or failed: the first stage's answer stands
            raise EndpointError(f"the client's model refused: {exc.error.message}") from exc
        content = result.content
        blocks = content if isinstance(content, list) else [content]
        text = "".join(block.text for block in blocks if isinstance(block, types.TextContent))
        if not text:
            raise EndpointError("the client's model answered no text")
        return text

    return ask
