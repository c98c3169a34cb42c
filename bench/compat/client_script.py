"""Drive the gateway with a third-party Python client: the SDK 1.x `ClientSession` or FastMCP's `Client`.

Run by `bench.compat.clients` with the Python of the client's own venv (their SDKs cannot be
imported beside the gateway's), so this file imports only what that venv has:

    python client_script.py sdk1|fastmcp TOOL ARGS_JSON -- COMMAND ARG...   # the gateway over stdio
    python client_script.py sdk1|fastmcp TOOL ARGS_JSON URL                 # over streamable HTTP

It lists the tools, calls TOOL, and prints one JSON line: the tool names, whether the call
was an error, and the call's text. The gateway child gets this process's environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any


async def sdk1(target: list[str], tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamablehttp_client

    async def session(read: Any, write: Any) -> dict[str, Any]:
        async with ClientSession(read, write) as client:
            await client.initialize()
            tools = (await client.list_tools()).tools
            result = await client.call_tool(tool, arguments)
            text = " ".join(getattr(block, "text", "") for block in result.content)
            return {"tools": [t.name for t in tools], "is_error": bool(result.isError), "text": text}

    if target[0] == "--":
        params = StdioServerParameters(command=target[1], args=target[2:], env=dict(os.environ))
        async with stdio_client(params) as (read, write):
            return await session(read, write)
    async with streamablehttp_client(target[0]) as (read, write, _):
        return await session(read, write)


async def fastmcp(target: list[str], tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport

    if target[0] == "--":
        client = Client(StdioTransport(command=target[1], args=target[2:], env=dict(os.environ)))
    else:
        client = Client(target[0])
    async with client:
        tools = await client.list_tools()
        result = await client.call_tool(tool, arguments, raise_on_error=False)
        text = " ".join(getattr(block, "text", "") for block in result.content)
        return {"tools": [t.name for t in tools], "is_error": bool(result.is_error), "text": text}


def main() -> None:
    kind, tool, raw_arguments, *target = sys.argv[1:]
    drive = {"sdk1": sdk1, "fastmcp": fastmcp}[kind]
    print(json.dumps(asyncio.run(drive(target, tool, json.loads(raw_arguments)))))


if __name__ == "__main__":
    main()
