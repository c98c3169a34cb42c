"""What an upstream is (its spec), the states it goes through, and what it reports to its owner."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from mcp import StdioServerParameters
from mcp.server import MCPServer, Server

if TYPE_CHECKING:
    from gateway.upstreams.oauth.binding import OAuthBinding

__all__ = ["CONNECTED_STATES", "LISTED_STATES", "ServerState", "Transport", "UpstreamSpec"]

ServerState = Literal["starting", "ready", "degraded", "idle", "needs_login", "failed", "disabled", "stopped"]
"""`needs_login`: an OAuth server with no usable grant, waiting (without retrying) for one to be stored."""
MIN_SECRET_LENGTH = 4
"""Shorter configured values are not masked: they would garble ordinary words."""
CONNECTED_STATES = ("ready", "degraded")
"""States in which requests are sent: `degraded` is connected but failing health checks."""
LISTED_STATES = (*CONNECTED_STATES, "idle")
"""States whose listing is in the catalog: an `idle` on-demand server starts on its first call."""
Transport = Literal["memory", "stdio", "http", "sse"]


@dataclass(frozen=True)
class UpstreamSpec:
    """Everything needed to connect to one server, whatever its origin."""

    id: str
    prefix: str
    transport: Transport
    target: MCPServer | Server[Any] | StdioServerParameters | str
    name: str = ""
    description: str = ""
    capabilities: tuple[str, ...] = ()
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout: float | None = None
    enabled: bool = True
    origin: str = "config"
    """`config` for YAML servers, `plugin:<name>` for internal ones."""
    tool_filter: Callable[[str], bool] | None = None
    protocol: Literal["auto", "legacy"] = "auto"
    """`auto` probes 2026-07-28 `server/discover` first; `legacy` goes straight to `initialize`."""
    tool_timeouts: Mapping[str, float] = field(default_factory=dict)
    """Per-tool timeouts, by fnmatch glob on the server's own tool names; first match wins."""
    retry_tools: tuple[str, ...] = ()
    """Globs of tools safe to retry after the request was sent, besides annotated ones."""
    max_concurrent_calls: int | None = None
    """Most requests in flight at once; None: the gateway-wide default."""
    health_interval: float | None = None
    """Seconds between pings; None: the gateway-wide default; 0: none."""
    start: Literal["eager", "on_demand"] = "eager"
    """`on_demand`: started by its first call (stdio servers), stopped again after `idle_timeout`."""
    idle_timeout: float = 300.0
    """Seconds without calls after which an on-demand server is stopped."""
    forward_caller_token: bool = False
    """Whether requests made for a caller carry the caller's own bearer token (`gateway.upstreams.caller_sessions`)."""
    oauth: OAuthBinding | None = None
    """`auth: oauth`: where the server's grants are and how requests carry them (`gateway.upstreams.oauth`)."""
    oauth_account: str | None = None
    """Whose grant this session uses: None for the gateway's own, a caller's account for `per_user` sessions."""
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """Credential and header values, masked wherever the server's words are repeated."""
    stderr_level: int = logging.DEBUG
    """The log level of a stdio server's stderr lines (`gateway.upstreams.stderr`)."""
    failure: str | None = None
    """Why this server cannot start at all (a plugin that failed to load or register): it is shown
    `failed` with this reason and never connected."""

    @property
    def display_name(self) -> str:
        return self.name or self.id

    def redact(self, text: str) -> str:
        """`text` with every configured secret of this server replaced by `***`."""
        for secret in self.secrets:
            if len(secret) >= MIN_SECRET_LENGTH:
                text = text.replace(secret, "***")
        return text
