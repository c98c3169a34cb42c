"""Scopes ("virtual servers"): what one caller may see and call, from its profile.

A profile lists server id globs, exposed tool name globs and denied tool globs. What
a caller may not use does not exist for it: it is not listed (in every exposure mode),
not searchable, and a call by name gets the very `tool_not_found` a truly unknown name
gets, with hints drawn only from what it may see. Prompts and resources follow the
visibility of their server. A caller with no profile (stdio, in memory, a key without
`profile:`) sees everything.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.catalog import Entry
from gateway.errors import ToolNotFound
from gateway.security.auth import Principal

__all__ = ["server_visible", "tool_not_found", "tool_visible", "visible", "visible_names"]


def _matches(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, glob) for glob in globs)


def server_visible(principal: Principal | None, server_id: str) -> bool:
    """May this caller see anything of this server?"""
    if principal is None or principal.profile is None:
        return True
    return _matches(server_id, principal.profile.servers)


def visible(principal: Principal | None, entry: Entry[Any]) -> bool:
    """May this caller see and call this catalog item (a tool, or a prompt/resource by its server)?"""
    if hasattr(entry.item, "input_schema"):
        return tool_visible(principal, entry.server_id, entry.exposed)
    return server_visible(principal, entry.server_id)  # prompts and resources: their server decides


def tool_visible(principal: Principal | None, server_id: str, exposed: str) -> bool:
    """May this caller see the tool `exposed` of `server_id` (whether or not it is in the catalog now)?"""
    if principal is None or principal.profile is None:
        return True
    profile = principal.profile
    return (
        _matches(server_id, profile.servers)
        and _matches(exposed, profile.tools)
        and not _matches(exposed, profile.deny_tools)
    )


def visible_names(principal: Principal | None, entries: Mapping[str, Entry[Any]]) -> list[str]:
    return [name for name, entry in entries.items() if visible(principal, entry)]


def tool_not_found(name: str, candidates: list[str]) -> ToolNotFound:
    """The error for a name this caller cannot use: word for word the unknown-tool one."""
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ToolNotFound(f"There is no tool named {name!r}.{hint}")
