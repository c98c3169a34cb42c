"""The merged catalog: every server's tools, prompts, resources and templates under one roof.

Names are made collision-free and reversible:

- tools and prompts become `prefix__name`, limited to `^[a-zA-Z0-9_-]{1,64}$` (what the
  OpenAI and Anthropic APIs accept); other characters become `_`, and a name over 64
  characters is cut and given a stable hash suffix;
- resource URIs and URI templates become `prefix+uri` (`notes+note://todo`);
- a server with `prefix: ""` keeps its names as they are unless that collides, in which
  case its id is used as the prefix for the colliding item.

Collisions are resolved in a fixed order (server order, then upstream name), never by
dropping an item, and each resolution is recorded in `Catalog.collisions`.
Building a catalog is a pure function of the servers' listings, so it is cheap to test
and to rebuild whenever a server's list changes.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import mcp_types as types
from mcp.shared.uri_template import InvalidUriTemplate, UriTemplate

__all__ = [
    "MAX_NAME_LENGTH",
    "NAME_PATTERN",
    "SERVER_META_KEY",
    "Catalog",
    "Entry",
    "ServerListing",
    "build_catalog",
    "expose_name",
    "expose_uri",
]

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_NAME_LENGTH = 64
SEPARATOR = "__"
URI_SEPARATOR = "+"
SERVER_META_KEY = "mcp-gateway/server"
"""`_meta` key on every listed item: the id of the server it comes from."""

_INVALID_CHARS = re.compile(r"[^a-zA-Z0-9_-]")

ItemT = TypeVar("ItemT", types.Tool, types.Prompt, types.Resource, types.ResourceTemplate)


@dataclass(frozen=True)
class ServerListing:
    """What one connected server offers, as fetched from it (all pages)."""

    server_id: str
    prefix: str
    tools: Sequence[types.Tool] = ()
    prompts: Sequence[types.Prompt] = ()
    resources: Sequence[types.Resource] = ()
    templates: Sequence[types.ResourceTemplate] = ()


@dataclass(frozen=True)
class Entry(Generic[ItemT]):
    """One catalog item: the name clients see, and where it really lives."""

    exposed: str
    server_id: str
    original: str
    item: ItemT


@dataclass
class Catalog:
    """The merged view served downstream. Replace it whole; never mutate a published one."""

    tools: dict[str, Entry[types.Tool]] = field(default_factory=dict)
    prompts: dict[str, Entry[types.Prompt]] = field(default_factory=dict)
    resources: dict[str, Entry[types.Resource]] = field(default_factory=dict)
    templates: dict[str, Entry[types.ResourceTemplate]] = field(default_factory=dict)
    prefixes: dict[str, str] = field(default_factory=dict)
    """server id -> prefix, for reversing URIs."""
    collisions: list[str] = field(default_factory=list)
    """One sentence per collision that was resolved by renaming."""

    def resolve_resource(self, uri: str) -> tuple[str, str] | None:
        """Map a URI a client asked for to `(server_id, upstream_uri)`.

        Accepts the namespaced form, and also a raw upstream URI (such as one inside a
        `resource_link` a tool returned) when exactly one server lists it or one
        server's template matches it.
        """
        if (entry := self.resources.get(uri)) is not None:
            return entry.server_id, entry.original
        for server_id, prefix in self.prefixes.items():
            if prefix and uri.startswith(prefix + URI_SEPARATOR):
                return server_id, uri[len(prefix) + len(URI_SEPARATOR) :]
        owners = {e.server_id for e in self.resources.values() if e.original == uri}
        if len(owners) == 1:
            return owners.pop(), uri
        matches = {e.server_id for e in self.templates.values() if _template_matches(e.original, uri)}
        if len(matches) == 1:
            return matches.pop(), uri
        passthrough = [sid for sid, prefix in self.prefixes.items() if prefix == ""]
        if len(passthrough) == 1 and not owners and not matches:
            return passthrough[0], uri
        return None

    def resolve_template(self, uri_template: str) -> tuple[str, str] | None:
        """Map an exposed resource template (a completion ref) to `(server_id, upstream_template)`."""
        entry = self.templates.get(uri_template)
        return (entry.server_id, entry.original) if entry is not None else None

    def server_items(self, server_id: str) -> int:
        """How many tools a server contributes (for status tables)."""
        return sum(1 for e in self.tools.values() if e.server_id == server_id)


def _template_matches(template: str, uri: str) -> bool:
    try:
        return UriTemplate.parse(template).match(uri) is not None
    except InvalidUriTemplate:
        return False


def _shorten(name: str) -> str:
    """Cut a name to 64 characters, keeping it unique with a hash of the whole name."""
    if len(name) <= MAX_NAME_LENGTH:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_NAME_LENGTH - len(digest) - 1]}_{digest}"


def expose_name(prefix: str, name: str) -> str:
    """The client-facing name of an upstream tool or prompt: `prefix__name`, made valid."""
    raw = f"{prefix}{SEPARATOR}{name}" if prefix else name
    cleaned = _INVALID_CHARS.sub("_", raw) or "_"
    return _shorten(cleaned)


def expose_uri(prefix: str, uri: str) -> str:
    """The client-facing URI (or URI template) of an upstream resource: `prefix+uri`."""
    return f"{prefix}{URI_SEPARATOR}{uri}" if prefix else uri


def _unique(candidate: str, taken: Mapping[str, object], make_variant: Callable[[int], str]) -> str:
    """First free name among `candidate`, then `make_variant(2)`, `make_variant(3)`, ..."""
    if candidate not in taken:
        return candidate
    n = 2
    while (variant := make_variant(n)) in taken:
        n += 1
    return variant


def _name_variant(base: str) -> Callable[[int], str]:
    return lambda n: _shorten(f"{base}_{n}")


def _uri_variant(base: str) -> Callable[[int], str]:
    return lambda n: f"{base}#{n}"


def _merge(
    listings: Sequence[ServerListing],
    items_of: Callable[[ServerListing], Sequence[ItemT]],
    key_of: Callable[[ItemT], str],
    expose: Callable[[str, str], str],
    rename: Callable[[ItemT, str, str], ItemT],
    kind: str,
    collisions: list[str],
) -> dict[str, Entry[ItemT]]:
    merged: dict[str, Entry[ItemT]] = {}
    is_name = expose is expose_name
    for listing in listings:
        for item in sorted(items_of(listing), key=key_of):
            original = key_of(item)
            exposed = expose(listing.prefix, original)
            if exposed in merged:
                first = exposed
                base = expose(listing.server_id, original) if listing.prefix == "" else exposed
                exposed = _unique(base, merged, _name_variant(base) if is_name else _uri_variant(base))
                collisions.append(
                    f"{kind} {first!r} of server {listing.server_id!r} collides with server "
                    f"{merged[first].server_id!r}; it is exposed as {exposed!r}"
                )
            merged[exposed] = Entry(exposed, listing.server_id, original, rename(item, exposed, listing.server_id))
    return merged


def _with_meta(meta: dict[str, object] | None, server_id: str) -> dict[str, object]:
    return {**(meta or {}), SERVER_META_KEY: server_id}


def build_catalog(listings: Sequence[ServerListing]) -> Catalog:
    """Merge the listings, in the given (configuration) order, into one catalog."""
    collisions: list[str] = []
    tools = _merge(
        listings,
        lambda s: s.tools,
        lambda t: t.name,
        expose_name,
        lambda t, name, sid: t.model_copy(update={"name": name, "meta": _with_meta(t.meta, sid)}),
        "tool",
        collisions,
    )
    prompts = _merge(
        listings,
        lambda s: s.prompts,
        lambda p: p.name,
        expose_name,
        lambda p, name, sid: p.model_copy(update={"name": name, "meta": _with_meta(p.meta, sid)}),
        "prompt",
        collisions,
    )
    resources = _merge(
        listings,
        lambda s: s.resources,
        lambda r: r.uri,
        expose_uri,
        lambda r, uri, sid: r.model_copy(update={"uri": uri, "meta": _with_meta(r.meta, sid)}),
        "resource",
        collisions,
    )
    templates = _merge(
        listings,
        lambda s: s.templates,
        lambda t: t.uri_template,
        expose_uri,
        lambda t, uri, sid: t.model_copy(update={"uri_template": uri, "meta": _with_meta(t.meta, sid)}),
        "resource template",
        collisions,
    )
    return Catalog(
        tools=tools,
        prompts=prompts,
        resources=resources,
        templates=templates,
        prefixes={listing.server_id: listing.prefix for listing in listings},
        collisions=collisions,
    )
