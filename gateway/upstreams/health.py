"""One health probe of an upstream session: what the supervisor's health worker sends and how
it reads the answer (`Upstream._health_worker` counts the misses)."""

from __future__ import annotations

from typing import Literal

import anyio
import mcp_types as types
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.upstreams.listing import Unsupported, method_not_found
from gateway.upstreams.subscriptions import legacy_call

__all__ = ["ProbeOutcome", "probe"]

ProbeOutcome = Literal["answered", "errored", "missed"]
"""`errored`: the server answered with an error of its own (it is alive, if only to say it has no ping)."""


async def probe(client: Client, timeout: float, unsupported: Unsupported) -> ProbeOutcome:
    """Send the cheapest request a server must answer, within `timeout` seconds."""
    try:
        with anyio.fail_after(timeout):
            await _send_probe(client)
    except MCPError as exc:
        if exc.code in (types.CONNECTION_CLOSED, types.REQUEST_TIMEOUT):
            return "missed"
        if method_not_found(exc):
            modern = client.protocol_version in MODERN_PROTOCOL_VERSIONS
            unsupported.note("server/discover" if modern else "ping")
        return "errored"
    except (TimeoutError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        return "missed"
    return "answered"


async def _send_probe(client: Client) -> None:
    """`ping` before 2026-07-28, which removed it, and a `server/discover` at the negotiated
    version from then on."""
    if client.protocol_version in MODERN_PROTOCOL_VERSIONS:
        await client.session.send_discover(client.protocol_version)
    else:
        await legacy_call(client.send_ping)
