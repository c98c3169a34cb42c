"""What `/healthz`, `/readyz` and `mcp-gateway servers` say about the gateway and each upstream."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.upstreams.spec import LISTED_STATES
from gateway.upstreams.upstream import Upstream

__all__ = ["is_ready", "server_health"]


def server_health(upstream: Upstream, *, breaker: str, tools: int, stderr: bool = False) -> dict[str, Any]:
    """One server's state with its reason and timestamps, its breaker, its load and how many tools
    it contributes; with `stderr`, the last lines a stdio server wrote there (for `mcp-gateway
    check`/`servers`, not `/readyz`). `Registry.server_health` fills in the breaker and tools."""
    health: dict[str, Any] = {
        "server": upstream.id,
        "state": upstream.state,
        "reason": upstream.reason,
        "since": upstream.state_since.isoformat(timespec="seconds"),
        "retry_at": upstream.retry_at.isoformat(timespec="seconds") if upstream.retry_at else None,
        "breaker": breaker,
        "in_flight": upstream.limiter.borrowed_tokens,
        "tools": tools,
    }
    if stderr:
        health["stderr"] = upstream.stderr_tail
    return health


def is_ready(upstreams: Iterable[Upstream]) -> bool:
    """Ready once every server's first connection attempt has finished and, if any server is
    enabled, at least one is connected (or idle, ready to start on demand): one dead
    upstream must not take the gateway out of a load balancer while it serves the others."""
    enabled = [u for u in upstreams if u.spec.enabled]
    if not all(u.settled for u in enabled):
        return False
    return not enabled or any(u.state in LISTED_STATES for u in enabled)
