"""The downstream side: the MCP server clients talk to, over stdio or HTTP, and what it passes through."""
