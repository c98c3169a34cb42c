"""The router as the gateway runs it: kept in step with the catalog, searched off the event loop.

Loading the model and embedding tools take seconds; searching takes milliseconds of
CPU. Both run in a worker thread so the event loop keeps serving, and index updates
are serialized and coalesced: a burst of list_changed notifications costs one update.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from gateway.errors import GatewayError
from gateway.progress import TerminalProgress
from gateway.router.base import Embedder, SearchHit, ToolRecord

if TYPE_CHECKING:
    from gateway.plugins import PluginManager
    from gateway.registry import Registry
    from gateway.router.index import Router
    from gateway.settings import Settings

__all__ = ["RouterService", "RouterUnavailable", "build_router", "load_router_embedder", "records_from_registry"]

logger = logging.getLogger(__name__)


class RouterUnavailable(GatewayError):
    """The router could not be built; searching is impossible until the gateway restarts."""


def load_router_embedder(settings: Settings, pm: PluginManager | None) -> Embedder | None:
    """A plugin's embedder (`gateway_embedder`) if one provides it, else the configured fastembed model."""
    if pm is not None:
        provided = pm.hook.gateway_embedder(settings=settings)
        if provided is not None:
            if not isinstance(provided, Embedder):
                raise TypeError(f"gateway_embedder returned {type(provided).__name__}, which is not an Embedder")
            logger.info("router: embedding model %s (from a plugin)", provided.model_id)
            return provided
    from gateway.router.embedder import load_embedder

    return load_embedder(settings.embedding, settings.data_dir)


def build_router(settings: Settings, pm: PluginManager | None) -> Router:
    """The configured router: the embedder (or BM25 alone) and the on-disk embedding cache."""
    from gateway.router.cache import SqliteEmbeddingCache
    from gateway.router.index import Router

    embedder = load_router_embedder(settings, pm)
    cache = SqliteEmbeddingCache(settings.data_dir / "embeddings.sqlite") if embedder is not None else None
    return Router(embedder, cache=cache)


def records_from_registry(registry: Registry) -> list[ToolRecord]:
    """The catalog's tools as the router indexes them, with what describes their servers."""
    records = []
    for name, entry in registry.catalog.tools.items():
        upstream = registry.upstreams[entry.server_id]
        spec = upstream.spec
        info = upstream.server_info
        records.append(
            ToolRecord(
                name=name,
                server_id=entry.server_id,
                tool=entry.item,
                original_name=entry.original,
                server_name=spec.display_name,
                server_description=spec.description or (info.description if info and info.description else ""),
                capabilities=spec.capabilities,
            )
        )
    return records


class RouterService:
    """Owns the `Router` of a running gateway. Start `run()` in the registry's task group."""

    def __init__(
        self,
        registry: Registry,
        settings: Settings,
        make_router: Callable[[], Router],
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.make_router = make_router
        self.router: Router | None = None
        self.ready = anyio.Event()
        """Set once the first index is built."""
        self._dirty = anyio.Event()
        self._dirty.set()
        self._lock = anyio.Lock()
        self.failed = False
        """True when the router could not be built: searches then fail clearly."""
        registry.change_listeners.append(self._on_change)

    async def _on_change(self, kinds: set[str]) -> None:
        if "tools" in kinds:
            self._dirty.set()

    async def run(self) -> None:
        """Load the model, then re-index whenever the tools change, until cancelled.

        Never raises: a router that cannot be built or updated leaves the gateway
        serving, with tool search answering that it is unavailable.
        """
        started = time.perf_counter()
        try:
            router = await anyio.to_thread.run_sync(self.make_router)
        except Exception:  # noqa: BLE001 - boundary: search is optional, proxying is not
            logger.exception("router: could not be built; tool search is unavailable")
            self.failed = True
            self.ready.set()
            return
        self.router = router
        logger.info(
            "router: ready to index (%s) in %.1f s",
            "embeddings + BM25" if router.dense else "BM25 only",
            time.perf_counter() - started,
        )
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            try:
                await self.sync()
            except Exception:  # noqa: BLE001 - boundary: keep the last good index and keep serving
                logger.exception("router: updating the index failed; searching the previous one")
                self.ready.set()

    async def sync(self) -> None:
        """Make the index match the catalog now."""
        if self.router is None:
            return
        records = records_from_registry(self.registry)
        router = self.router
        async with self._lock:
            started = time.perf_counter()
            progress = TerminalProgress("mcp-gateway: indexing tools")
            await anyio.to_thread.run_sync(lambda: router.update(records, progress=progress))
            logger.debug("router: indexed %d tools in %.2f s", len(records), time.perf_counter() - started)
        self.ready.set()

    async def search(self, query: str, k: int, threshold: float) -> list[SearchHit]:
        """Rank the catalog's tools for `query`, waiting (bounded) for the first index."""
        with anyio.fail_after(self.settings.routing.search_timeout):
            await self.ready.wait()
            router = self.router
            if router is None:
                raise RouterUnavailable("Tool search is unavailable on this gateway (see its log).")
            return await anyio.to_thread.run_sync(
                lambda: router.search(query, k=k, threshold=threshold), abandon_on_cancel=True
            )
