"""Admission, first layer: a caller's profile decides which tools exist for them (`gateway.security.scopes`).

A tool the caller may not see gets the very `tool_not_found` an unknown name gets, with hints drawn
only from what they may see. A name that is not in the catalog is checked against the server its
prefix belongs to, so a caller learns that a server is down only if they may see that server's tool.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import mcp_types as types

from gateway.calls.chain import CallHandler, ToolCall, refuse
from gateway.catalog import Entry
from gateway.security.scopes import tool_not_found, tool_visible, visible, visible_names

__all__ = ["Access"]


class Access:
    """Refuse a call of a tool its caller may not see (or that does not exist)."""

    def __init__(
        self, tools: Callable[[], Mapping[str, Entry[types.Tool]]], owner_of: Callable[[str], Any | None]
    ) -> None:
        """`tools()`: the catalog's tools now; `owner_of(name)`: the upstream a name's prefix belongs to."""
        self.tools = tools
        self.owner_of = owner_of

    def check(self, call: ToolCall) -> None:
        """Refuse (`refuse`) a call of a tool its caller may not see, as if it did not exist."""
        if call.caller is not None:
            principal = call.caller.principal
            tools = self.tools()
            entry = tools.get(call.name)
            if entry is not None:
                hidden = not visible(principal, entry)
            elif (owner := self.owner_of(call.name)) is not None:  # a server that is down, or a withheld tool:
                hidden = not tool_visible(principal, owner.id, call.name)  # may this caller know of it?
            else:
                hidden = True  # unknown: the same error, with hints from what this caller may see
            if hidden:
                raise refuse(call, tool_not_found(call.name, visible_names(principal, tools)))

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        self.check(call)  # `chain.compose` calls the check alone (`CheckLayer`)
        return await call_next(call)
