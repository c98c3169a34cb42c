"""Who made a request, as records name it: a session id and a client id.

- client: the authenticated caller (`Principal.name`: the API key's name or the JWT
  subject); None without authentication (stdio, in memory, HTTP without `auth:`). Searches
  and calls are tied by it, so it is never a name two callers could share.
- client label (`client_label`): what a record shows as its client when there is no
  authenticated caller: the MCP client's own `clientInfo` as `name/version`
  (`claude-code/1.0.3`). Only shown, never used to tie requests together.
- session: over HTTP, the `Mcp-Session-Id` of a handshake-era session; None in
  stateless mode and for 2026-07-28 clients, which have no sessions: there only the
  caller ties requests together. Over stdio (and in memory), an id the gateway gives
  each handshake-era connection; 2026-07-28 requests, which come without one, share
  the process's id, since a stdio gateway serves one client.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from mcp.server import ServerRequestContext
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.relay import connection_of
from gateway.security.http_guard import principal_in

__all__ = ["CallerIds", "client_label"]

MAX_LABEL = 80
"""The most characters of a client's `name/version` kept (they are the client's own words)."""


def client_label(ctx: ServerRequestContext[Any, Any]) -> str | None:
    """The MCP client's `clientInfo` as `name/version`, from its handshake (or, on 2026-07-28, its
    request's envelope); None when it sent none."""
    params = ctx.session.client_params if ctx.session is not None else None
    info = params.client_info if params is not None else None
    if info is None or not info.name:
        return None
    label = f"{info.name}/{info.version}" if info.version else info.name
    return label[:MAX_LABEL]


class CallerIds:
    def __init__(self) -> None:
        self._sessions: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._process_session = uuid.uuid4().hex[:16]

    def of(self, ctx: ServerRequestContext[Any, Any], *, stateless: bool) -> tuple[str | None, str | None]:
        """`(session_id, client_id)` of a request; `stateless`: served by stateless HTTP."""
        principal = principal_in(ctx.request)
        client_id = principal.name if principal is not None else None
        if ctx.request is not None:
            headers = getattr(ctx.request, "headers", None)
            session_id = headers.get("mcp-session-id") if headers is not None else None
            return (None if stateless else session_id or None), client_id
        connection = connection_of(ctx)
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS or connection is None:
            return self._process_session, client_id
        found = self._sessions.get(connection)
        if found is None:
            found = self._sessions[connection] = uuid.uuid4().hex[:16]
        return found, client_id
