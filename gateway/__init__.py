"""mcp-gateway: one MCP endpoint in front of many MCP servers."""

from gateway.hookspecs import hookimpl

__all__ = ["hookimpl"]
