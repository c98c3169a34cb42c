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
    import mcp_types as types

    from gateway.plugins import PluginManager
    from gateway.registry import Registry
    from gateway.router.index import Router
    from gateway.settings import Settings

__all__ = [
    "RouterService",
    "RouterUnavailable",
    "build_router",
    "enrichment",
    "load_router_embedder",
    "records_from_registry",
]

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
    """The configured router: the embedder (or BM25 alone) and the embedding cache (SQLite in the
    data dir, or the PostgreSQL database of `GATEWAY_DATABASE_URL`, shared by replicas)."""
    from gateway.router.cache import open_embedding_cache
    from gateway.router.index import Router

    embedder = load_router_embedder(settings, pm)
    cache = open_embedding_cache(settings.database_url, settings.data_dir) if embedder is not None else None
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
                extra=enrichment(registry.plugins, entry.item, entry.server_id),
            )
        )
    return records


def enrichment(pm: PluginManager | None, tool: types.Tool, server_id: str) -> tuple[str, ...]:
    """What every plugin's `gateway_enrich_tool` adds for one tool, in plugin order.

    A plugin that fails or returns something other than text is logged and skipped: a bad
    enrichment must not stop the router from indexing.
    """
    if pm is None:
        return ()
    texts: list[str] = []
    for impl in pm.hook.gateway_enrich_tool.get_hookimpls():
        try:
            found = impl.function(**{name: {"tool": tool, "server_id": server_id}[name] for name in impl.argnames})
        except Exception:  # boundary: one plugin's bug must not stop indexing
            logger.exception("plugin %r failed in gateway_enrich_tool for %r", impl.plugin_name, tool.name)
            continue
        if found is None:
            continue
        values = [found] if isinstance(found, str) else found
        if not isinstance(values, list | tuple) or not all(isinstance(value, str) for value in values):
            logger.warning("plugin %r returned non-text from gateway_enrich_tool; ignored", impl.plugin_name)
            continue
        texts += [value.strip() for value in values if value.strip()]
    return tuple(texts)


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
        """Set once the first index is built (BM25 at first)."""
        self.complete = anyio.Event()
        """Set once the full router (with the embedding model, when there is one) serves."""
        self._dirty = anyio.Event()
        self._lock = anyio.Lock()
        registry.change_listeners.append(self._on_change)

    async def _on_change(self, kinds: set[str]) -> None:
        if "tools" in kinds:
            self._dirty.set()

    async def run(self) -> None:
        """Index with BM25 at once, then load the model and switch to the full router.

        Searches work from the first second (lexically), and get semantic as soon as
        the model is loaded and the tools embedded. Never raises: a router that cannot
        be built or updated leaves the gateway serving, and search says it is unavailable.
        """
        from gateway.router.index import Router

        # The first index covers the servers that connect at start-up (bounded wait);
        # later ones are added when they announce their tools.
        await self.registry.wait_settled(self.settings.list_wait)
        self.router = Router(None)
        await self._sync_logged()
        started = time.perf_counter()
        try:
            full = await anyio.to_thread.run_sync(self.make_router)
            if full.dense:
                records = records_from_registry(self.registry)
                progress = TerminalProgress("mcp-gateway: indexing tools")
                async with self._lock:
                    await anyio.to_thread.run_sync(lambda: full.update(records, progress=progress))
                    self.router = full
        except Exception:  # noqa: BLE001 - boundary: lexical search goes on without the model
            logger.exception("router: the embedding index could not be built; searching with BM25 alone")
        self.complete.set()
        logger.info(
            "router: %s, ready in %.1f s (%d tool documents embedded, %d from the embedding cache)",
            "embeddings + BM25" if self.router.dense else "BM25 only",
            time.perf_counter() - started,
            self.router.embedded_documents,
            self.router.cached_documents,
        )
        while True:
            await self._dirty.wait()
            self._dirty = anyio.Event()
            await self._sync_logged()

    async def _sync_logged(self) -> None:
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
