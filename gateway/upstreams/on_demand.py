"""An on-demand server's start and stop: listed from its saved listing without running, started
by its first call, stopped again after `idle_timeout` seconds without one.

The `Upstream` supervisor asks `OnDemand` when to start and when to stop; requests tell it
when they begin and end (`begin`/`end`), so a server never goes idle under a waiting call.
"""

from __future__ import annotations

import logging
from pathlib import Path

import anyio
from mcp import StdioServerParameters

from gateway.catalog import ServerListing
from gateway.upstreams.listing_cache import fingerprint, load_listing, save_listing
from gateway.upstreams.spec import UpstreamSpec
from gateway.upstreams.subscriptions import cancel_when

__all__ = ["IDLE_CHECK_SECONDS", "OnDemand"]

logger = logging.getLogger("gateway.upstreams.upstream")

IDLE_CHECK_SECONDS = 5.0
"""At most this long between two looks at whether an on-demand server has gone idle."""


class OnDemand:
    """The on-demand state of one server (`start: on_demand`); inert for a server started at once."""

    def __init__(self, spec: UpstreamSpec, listing_dir: Path | None) -> None:
        self.spec = spec
        self.listing_dir = listing_dir
        """Where an on-demand server's last listing is kept (see `gateway.upstreams.listing_cache`)."""
        self.enabled = spec.start == "on_demand"
        self.went_idle = False
        """Set when the idle worker stopped the server; the supervisor then waits for the next call."""
        self._wanted = anyio.Event()
        self._last_used = 0.0
        self._pending = 0
        """Requests started and not finished, including those waiting for a connection."""

    def cached_listing(self) -> ServerListing | None:
        """An on-demand server's saved listing, if it is still valid: then it need not start yet."""
        if not self.enabled or self.listing_dir is None:
            return None
        assert isinstance(self.spec.target, StdioServerParameters)
        return load_listing(self.listing_dir, self.spec.id, self.spec.prefix, fingerprint(self.spec.target))

    def save_listing(self, listing: ServerListing) -> None:
        if self.enabled and self.listing_dir is not None:
            assert isinstance(self.spec.target, StdioServerParameters)
            save_listing(self.listing_dir, listing, fingerprint(self.spec.target))

    async def wait_wanted(self, stop: anyio.Event) -> None:
        """Wait (idle) until a call wants this server, or `stop` is set."""
        async with anyio.create_task_group() as tg:
            tg.start_soon(cancel_when, stop, tg.cancel_scope)
            await self._wanted.wait()
            tg.cancel_scope.cancel()
        self._wanted = anyio.Event()

    def want(self) -> None:
        """A call needs the (idle) server: start it."""
        self._wanted.set()

    def begin(self) -> None:
        """A request started (it may be waiting for the server to start)."""
        self._pending += 1

    def end(self) -> None:
        """A request ended: the idle time counts from now."""
        self._pending -= 1
        self.touch()

    def touch(self) -> None:
        self._last_used = anyio.current_time()

    async def idle_worker(self, watch: anyio.CancelScope) -> None:
        """Stop an on-demand server once it has had no call in flight for `idle_timeout` seconds."""
        while True:
            idle_for = anyio.current_time() - self._last_used
            if not self._pending and idle_for >= self.spec.idle_timeout:
                logger.info("server %r had no call for %g s; stopping it until the next one", self.spec.id, idle_for)
                self.went_idle = True
                watch.cancel()
                return
            await anyio.sleep(max(0.05, min(IDLE_CHECK_SECONDS, self.spec.idle_timeout - idle_for)))
