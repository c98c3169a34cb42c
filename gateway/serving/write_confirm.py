"""Code mode asks the client's user whether a program may call write tools (issue 27).

A program's write call that `GATEWAY_CODEMODE__ALLOW_WRITES` does not allow is refused, unless
the client's user says yes: the gateway sends a form elicitation (`elicitation/create`, one
boolean) on the `execute` request's own stream, once per run, and waits at most
`GATEWAY_CODEMODE__CONFIRM_SECONDS`. Accept with `allow: true` lets the run call write tools;
anything else (decline, cancel, an error, no answer in time) is a no.

Only a handshake-era client on a connection that carries server-to-client requests can be
asked (stdio, or HTTP with sessions), as for the router's sampling judge. A 2026-07-28 client
answers server questions only by retrying its request, and stateless HTTP has no session: their
programs get the refusal, which says how to allow the tool.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.codemode import ConfirmWrites

__all__ = ["ALLOW_FIELD", "write_confirmation"]

logger = logging.getLogger(__name__)

ALLOW_FIELD = "allow"
"""The form's one field: a boolean, true to let the run call write tools."""


def write_confirmation(ctx: ServerRequestContext[Any, Any], seconds: float) -> ConfirmWrites | None:
    """How to ask `ctx`'s client whether a run may call write tools, or None when it cannot be asked."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        return None
    caps = ctx.session.client_capabilities
    if caps is None or caps.elicitation is None or not ctx.session.can_send_request:
        return None
    if caps.elicitation.form is None and caps.elicitation.url is not None:
        return None  # URL mode only: it cannot show a form

    async def confirm(name: str) -> bool:
        request = types.ElicitRequest(
            params=types.ElicitRequestFormParams(
                message=f"The program wants to call write tools: {name} (and any others in this run). Allow?",
                requested_schema={
                    "type": "object",
                    "properties": {
                        ALLOW_FIELD: {
                            "type": "boolean",
                            "title": "Allow write tools in this run",
                            "description": "Yes lets this one program run call tools that may change something.",
                        }
                    },
                    "required": [ALLOW_FIELD],
                },
            )
        )
        with anyio.move_on_after(seconds):
            try:
                result = await ctx.session.send_request(
                    request, types.ElicitResult, metadata=ServerMessageMetadata(related_request_id=ctx.request_id)
                )
            except MCPError as exc:  # the client could not ask: a no
                logger.info("write confirmation for %s failed: %s", name, exc.error.message)
                return False
            return result.action == "accept" and (result.content or {}).get(ALLOW_FIELD) is True
        logger.info("write confirmation for %s: no answer in %s seconds", name, seconds)
        return False

    return confirm
