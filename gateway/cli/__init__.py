"""The `mcp-gateway` command."""
