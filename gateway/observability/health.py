"""What `/healthz`, `/readyz` and `mcp-gateway servers` say about the gateway and each upstream."""

from __future__ import annotations

from typing import Any

from gateway.registry import Registry
from gateway.upstreams.upstream import LISTED_STATES, Upstream

__all__ = ["is_ready", "server_health"]


def server_health(upstream: Upstream, registry: Registry, *, stderr: bool = False) -> dict[str, Any]:
    """One server's state with its reason and timestamps, its breaker, and its load; with `stderr`,
    the last lines a stdio server wrote there (for `mcp-gateway check`/`servers`, not `/readyz`)."""
    health: dict[str, Any] = {
        "server": upstream.id,
        "state": upstream.state,
        "reason": upstream.reason,
        "since": upstream.state_since.isoformat(timespec="seconds"),
        "retry_at": upstream.retry_at.isoformat(timespec="seconds") if upstream.retry_at else None,
        "breaker": registry.breakers.state(upstream.id),
        "in_flight": upstream.limiter.borrowed_tokens,
        "tools": registry.catalog.server_items(upstream.id),
    }
    if stderr:
        health["stderr"] = upstream.stderr_tail
    return health


def is_ready(registry: Registry) -> bool:
    """Ready once every server's first connection attempt has finished and, if any server is
    enabled, at least one is connected (or idle, ready to start on demand): one dead
    upstream must not take the gateway out of a load balancer while it serves the others."""
    enabled = [u for u in registry.upstreams.values() if u.spec.enabled]
    if not all(u.settled for u in enabled):
        return False
    return not enabled or any(u.state in LISTED_STATES for u in enabled)
