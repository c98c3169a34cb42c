"""Runtime tool disables from the console: a disabled tool leaves the catalog and a call of it is refused.

It works as vetting does, after it: `ToolSwitches.install` wraps the registry's listing filter
(the disabled tools are dropped from the vetted listings, so they are neither listed, nor
indexed by the router, nor callable for anyone) and its `withheld` error (a call of a
disabled tool gets `tool_withheld` saying an operator disabled it, not "no tool by that
name"). Without a database, disables live in memory: a restart serves every tool again. With one
(`shared`), they are the deployment's (`gateway.state.switches`): every replica applies them
(`refresh`, on a change notification), and they hold until an operator enables the tool.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import anyio

from gateway.catalog import ServerListing, expose_name
from gateway.errors import GatewayError, ToolWithheld
from gateway.registry import Registry
from gateway.state.switches import SharedSwitches

__all__ = ["ToolSwitches"]

ListingFilter = Callable[[Sequence[ServerListing]], list[ServerListing]]


class ToolSwitches:
    """The exposed names an operator disabled, applied to a registry's catalog."""

    def __init__(self, registry: Registry, shared: SharedSwitches | None = None) -> None:
        self.registry = registry
        self.shared = shared
        self.disabled: dict[str, str] = {}
        """Exposed name -> who disabled it."""
        self.hidden: dict[str, str] = {}
        """Exposed name -> server id, of the disabled tools the last rebuild dropped."""
        self._vet: ListingFilter | None = registry.listing_filter
        self._withheld: Callable[[str], GatewayError | None] | None = registry.withheld
        registry.listing_filter = self.filter
        registry.withheld = self.withheld

    def filter(self, listings: Sequence[ServerListing]) -> list[ServerListing]:
        vetted = self._vet(listings) if self._vet is not None else list(listings)
        if not self.disabled:
            self.hidden = {}
            return vetted
        hidden: dict[str, str] = {}
        kept = []
        for listing in vetted:
            tools = []
            for tool in listing.tools:
                exposed = expose_name(listing.prefix, tool.name)
                if exposed in self.disabled:
                    hidden[exposed] = listing.server_id
                else:
                    tools.append(tool)
            kept.append(replace(listing, tools=tools))
        self.hidden = hidden
        return kept

    def withheld(self, name: str) -> GatewayError | None:
        if name in self.disabled:
            return ToolWithheld(
                f"Tool {name!r} is disabled by an operator of this gateway and cannot be called now. "
                "Use another tool; an operator can enable it again in the console.",
                server=self.hidden.get(name),
                details={"reason": "disabled"},
            )
        return self._withheld(name) if self._withheld is not None else None

    async def set_enabled(self, name: str, enabled: bool, by: str) -> bool:
        """Disable or enable `name` (for every replica, with a database) and rebuild the catalog; returns
        whether anything changed."""
        if self.shared is not None:
            changed = await anyio.to_thread.run_sync(self.shared.set_enabled, "tools", name, enabled, by)
            await self.refresh()
            return changed
        if enabled == (name not in self.disabled):
            return False
        if enabled:
            del self.disabled[name]
        else:
            self.disabled[name] = by
        await self.registry.revet()
        return True

    async def refresh(self) -> None:
        """Take the deployment's disables (another replica changed them), rebuilding the catalog if they moved."""
        if self.shared is None:
            return
        now = await anyio.to_thread.run_sync(self.shared.disabled, "tools")
        if now != self.disabled:
            self.disabled = now
            await self.registry.revet()
