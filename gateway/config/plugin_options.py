"""`plugins.<name>.gateway:`, the gateway's own options for the servers a plugin registers.

They sit beside the plugin's settings but belong to the gateway, so the plugin's `Config`
model never sees them (a plugin may well have a `timeout` setting of its own). They
override what the plugin passed to `register(...)`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PluginOptions"]


class PluginOptions(BaseModel):
    """How the gateway serves one plugin's servers."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    timeout: float | None = Field(
        default=None, gt=0, le=3600, description="Seconds a call may take (default: GATEWAY_CALL_TIMEOUT)."
    )
    tool_timeouts: dict[str, float] = Field(
        default_factory=dict, description="Per-tool timeouts, by glob on the server's own tool names."
    )
    max_concurrent_calls: int | None = Field(default=None, ge=1, description="Most calls in flight at once.")
    isolation: Literal["none", "process"] = Field(
        default="none",
        description=(
            "`process`: serve the plugin's servers from a child process of their own (`gateway.plugin_host`), "
            "so a tool that blocks holds that process, not the gateway's event loop, and its timeout fires."
        ),
    )
