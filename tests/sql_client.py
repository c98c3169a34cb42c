"""Calling the sql plugin's tools from the SDK's client in tests: the result, its data, or its refusal."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp import Client

TIMEOUT = 10.0
"""Seconds any one tool call in these tests may take."""


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def call(client: Client, tool: str, **arguments: Any) -> types.CallToolResult:
    with anyio.fail_after(TIMEOUT):
        return await client.call_tool(tool, arguments)


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured result of a call that must succeed."""
    result = await call(client, tool, **arguments)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    return result.structured_content


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The message of a call that must be refused."""
    result = await call(client, tool, **arguments)
    assert result.is_error, text_of(result)
    return text_of(result)
