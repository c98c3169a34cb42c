"""A server that implements part of MCP, as many real ones do: a stdio child for the tolerance tests.

Built on the current SDK's low-level `Server`, like `mcp-server-sqlite` on the 1.x one:
it declares tools and resources, implements `tools/list`, `tools/call` and
`resources/list`, and answers "method not found" (-32601) to everything else, resource
templates, prompts, completion and subscriptions included.

Run `python tests/servers/partial_server.py`.
"""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server

ECHO = types.Tool(
    name="echo",
    description="Echo the text back.",
    input_schema={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)
NOTE = types.Resource(uri="memo://note", name="note", mime_type="text/plain")


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[ECHO])


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    text = str((params.arguments or {}).get("text", ""))
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=[NOTE])


def create_server() -> Server[Any]:
    return Server("partial", on_list_tools=list_tools, on_call_tool=call_tool, on_list_resources=list_resources)


async def main() -> None:
    server = create_server()
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, server.create_initialization_options())


if __name__ == "__main__":
    anyio.run(main)
