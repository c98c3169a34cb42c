"""What a server offers, asked for only as far as it says it offers it.

Many servers implement part of MCP: tools but no prompts, resources but no resource
templates (the Python SDK 1.x low-level `Server` answers `resources/templates/list` with
"Method not found" although it declares `resources`). So a list is asked for only when the
server's initialize result declares that capability, and a JSON-RPC "method not found"
(-32601) on any optional method means "none" or "not supported": it is logged once per
server at DEBUG and never fails the server.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from gateway.catalog import ServerListing

__all__ = ["Unsupported", "fetch_listing", "method_not_found", "unsupported_answer"]

logger = logging.getLogger(__name__)

MAX_PAGES = 1000
"""Upstream pagination cap: a server whose cursor never ends cannot hang a listing."""

_NONE_WHEN_UNSUPPORTED: dict[str, Callable[[], Any]] = {
    "completion/complete": lambda: types.CompleteResult(completion=types.Completion(values=[])),
}
"""What an optional request that the server does not support answers instead, by method."""


def method_not_found(exc: BaseException) -> bool:
    """Whether the server said it has no such method (JSON-RPC -32601)."""
    return isinstance(exc, MCPError) and exc.code == types.METHOD_NOT_FOUND


def unsupported_answer(operation: str) -> Callable[[], Any] | None:
    """The stand-in answer for `operation` when the server does not support it, if it is optional."""
    return _NONE_WHEN_UNSUPPORTED.get(operation)


class Unsupported:
    """The optional methods one server turned out not to support, each logged once at DEBUG."""

    def __init__(self, server_id: str) -> None:
        self.server_id = server_id
        self.methods: set[str] = set()

    def note(self, method: str) -> None:
        if method not in self.methods:
            self.methods.add(method)
            logger.debug("server %r does not support %s; taken as none", self.server_id, method)

    async def ask(self, method: str, request: Callable[[], Awaitable[Any]], default: Callable[[], Any]) -> Any:
        """`request()`, or `default()` when the server answers "method not found"."""
        try:
            return await request()
        except MCPError as exc:
            if not method_not_found(exc):
                raise
            self.note(method)
            return default()


async def fetch_listing(
    client: Client, prefix: str, unsupported: Unsupported, tool_filter: Callable[[str], bool] | None = None
) -> ServerListing:
    """Every item of each list the server declares a capability for (tools kept by `tool_filter`)."""
    caps = client.server_capabilities

    async def every(method: str, fetch: Callable[..., Awaitable[Any]], items: Callable[[Any], list[Any]]) -> list[Any]:
        return list(await unsupported.ask(method, lambda: _all_pages(fetch, items), list))

    tools: list[types.Tool] = []
    prompts: list[types.Prompt] = []
    resources: list[types.Resource] = []
    templates: list[types.ResourceTemplate] = []
    if caps.tools is not None:
        tools = await every("tools/list", client.list_tools, lambda r: r.tools)
        if tool_filter is not None:
            tools = [t for t in tools if tool_filter(t.name)]
    if caps.prompts is not None:
        prompts = await every("prompts/list", client.list_prompts, lambda r: r.prompts)
    if caps.resources is not None:
        resources = await every("resources/list", client.list_resources, lambda r: r.resources)
        templates = await every(
            "resources/templates/list", client.list_resource_templates, lambda r: r.resource_templates
        )
    return ServerListing(unsupported.server_id, prefix, tools, prompts, resources, templates)


async def _all_pages(fetch: Callable[..., Awaitable[Any]], items: Callable[[Any], list[Any]]) -> list[Any]:
    collected: list[Any] = []
    cursor: str | None = None
    for _ in range(MAX_PAGES):
        page = await fetch(cursor=cursor, cache_mode="refresh")
        collected.extend(items(page))
        cursor = page.next_cursor
        if not cursor:
            break
    return collected
