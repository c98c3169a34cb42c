"""An MCP server over stdio whose tool answers with the `_meta` of the request it serves.

`python tests/servers/meta_server.py`: tool `seen_meta` answers with the request's `_meta` as
JSON (keys as the server's SDK read them); with `report: true` it reports progress once first.
"""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context, MCPServer


def create_server() -> MCPServer:
    mcp = MCPServer("meta")

    @mcp.tool()
    async def seen_meta(ctx: Context, report: bool = False) -> str:
        """The request's `_meta`, as JSON; `report`: report progress once before answering."""
        if report:
            await ctx.report_progress(1, 1, "reported")
        meta: dict[str, Any] = dict(ctx.request_context.meta or {})
        return json.dumps(meta, sort_keys=True, default=str)

    return mcp


if __name__ == "__main__":
    create_server().run("stdio")
