"""The first seconds: the gateway serves at once, and requests made while servers are still
connecting wait for them (bounded), so a client that lists or calls early is not told "nothing"."""

from __future__ import annotations

import anyio

from gateway.config.settings import Settings
from gateway.registry import Registry

__all__ = ["HANDSHAKE_WAIT_SECONDS", "StartupWait"]

HANDSHAKE_WAIT_SECONDS = 8.0
"""The longest a handshake (`initialize`, `server/discover`) waits for servers still connecting,
whatever `list_wait` says. The SDK's client gives `server/discover` 10 s and then falls back to
`initialize`; a discover answered after that has already settled the connection on the 2026-07-28
protocol, so the fallback is refused and the client cannot connect at all."""


class StartupWait:
    """Bounded waits for servers still connecting at start-up."""

    def __init__(self, registry: Registry, settings: Settings) -> None:
        self.registry = registry
        self.settings = settings
        self._all_settled = False

    async def all_servers(self) -> None:
        """Let a list request made right after start-up wait (bounded) for servers still connecting.

        The gateway serves at once; a server that connects later is announced with
        list_changed. The short wait spares clients that list once and never listen.
        """
        if not self._all_settled:
            await self.registry.wait_settled(self.settings.list_wait)
            self._all_settled = all(u.settled for u in self.registry.upstreams.values())

    async def handshake(self) -> None:
        """Let a handshake wait for servers still connecting, at most `HANDSHAKE_WAIT_SECONDS`,
        so that the instructions it carries include theirs while the client is still waiting."""
        if not self._all_settled:
            await self.registry.wait_settled(min(self.settings.list_wait, HANDSHAKE_WAIT_SECONDS))

    async def owner_of(self, name: str) -> None:
        """Before resolving a name at start-up, wait for the server it belongs to to connect.

        A client may call a tool it knows from an earlier session before listing; that
        call should reach the server once it is up, not fail because it is still starting.
        """
        if self._all_settled or name in self.registry.catalog.tools or name in self.registry.catalog.prompts:
            return
        owner = self.registry.owner_of(name)
        if owner is None:
            await self.all_servers()
        elif not owner.settled:
            with anyio.move_on_after(self.settings.startup_timeout):
                await owner.wait_settled()
