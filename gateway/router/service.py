"""The router as the gateway runs it: kept in step with the catalog, searched off the event loop.

Loading the model and embedding tools take seconds; searching takes milliseconds of
CPU. Both run in a worker thread so the event loop keeps serving, and index updates
are serialized and coalesced: a burst of list_changed notifications costs one update.
After each update, the tools' full texts are embedded in the background (`Router.enrich`):
the index serves with the short texts' vectors meanwhile.

With a `SignalSource` (the records store), the router also learns from use: every
`GATEWAY_LEARNING__REFRESH_SECONDS` the signals recorded since the last read are fetched
and learnt in a worker thread (searches meanwhile use what was learnt before).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import anyio
import anyio.to_thread

from gateway.errors import GatewayError
from gateway.observability.metrics import RouterFigures
from gateway.router.base import Embedder, EmbeddingUnavailable, SearchHit, ToolRecord
from gateway.router.learning import LearningConfig
from gateway.router.progress import TerminalProgress
from gateway.router.signals import SignalSource, UsageSignal

if TYPE_CHECKING:
    import mcp_types as types
    from pluggy import PluginManager

    from gateway.catalog import Catalog
    from gateway.config.routing_settings import LearningSettings
    from gateway.config.settings import Settings
    from gateway.router.index import Router
    from gateway.upstreams.upstream import Upstream

__all__ = [
    "LATE_SIGNAL_SECONDS",
    "RouterService",
    "RouterUnavailable",
    "SignalCursor",
    "ToolSource",
    "build_router",
    "describe_embedder",
    "enrichment",
    "learning_config",
    "learning_parameters",
    "load_router_embedder",
    "records_from_registry",
]

logger = logging.getLogger(__name__)


class ToolSource(Protocol):
    """What the router reads of a running gateway's registry (`gateway.registry.Registry` is one):
    the catalog and its servers, the plugins that enrich tools, and word of catalog changes.
    An interface rather than an import, so that the router does not depend on the registry."""

    @property
    def catalog(self) -> Catalog: ...

    @property
    def upstreams(self) -> Mapping[str, Upstream]: ...

    @property
    def plugins(self) -> PluginManager | None: ...

    @property
    def change_listeners(self) -> list[Callable[[set[str]], Awaitable[None]]]: ...

    async def wait_settled(self, timeout: float | None = None) -> None: ...


class RouterUnavailable(GatewayError):
    """The router could not be built; searching is impossible until the gateway restarts."""


def load_router_embedder(settings: Settings, pm: PluginManager | None) -> Embedder | None:
    """A plugin's embedder (`gateway_embedder`) if one provides it, else the configured fastembed model.

    The fastembed model is shared: callers in one process with the same embedding settings
    and data dir (the gateway's router and the openapi plugin's operation index) get the
    same instance while any of them holds it, so the model is in memory once (a 60 MB session)
    and its query-first lock orders all their work.
    """
    if pm is not None:
        # The first plugin in plugin order that answers wins, as with every other hook (pluggy's own
        # `firstresult` call would ask the last registered first).
        impls = pm.hook.gateway_embedder.get_hookimpls()
        answers = (impl.function(**{name: settings for name in impl.argnames}) for impl in impls)
        provided = next((answer for answer in answers if answer is not None), None)
        if provided is not None:
            if not isinstance(provided, Embedder):
                raise TypeError(f"gateway_embedder returned {type(provided).__name__}, which is not an Embedder")
            logger.info("router: embedding model %s (from a plugin)", provided.model_id)
            return provided
    from gateway.router.model_loading import load_embedder

    key = (settings.embedding.model_dump_json(), str(settings.data_dir.resolve()))
    with _shared_lock:  # held while loading: a second caller waits for the first load, not a second one
        embedder = _shared_embedders.get(key)
        if embedder is None:
            embedder = load_embedder(settings.embedding, settings.data_dir)
            if embedder is not None:
                _shared_embedders[key] = embedder
        return embedder


def describe_embedder(embedder: Embedder | None) -> str:
    """The embedding backend in a few words, as `mcp-gateway eval` and `search` report it."""
    if embedder is None:
        return "none (BM25 alone)"
    backend = getattr(embedder, "backend", None)
    if isinstance(backend, str):
        return backend
    if type(embedder).__name__ == "FastEmbedEmbedder":
        return f"in-process {embedder.model_id}"
    return f"{type(embedder).__name__} {embedder.model_id}"


_shared_embedders: weakref.WeakValueDictionary[tuple[str, str], Embedder] = weakref.WeakValueDictionary()
"""Loaded fastembed models by (embedding settings, data dir); gone when nobody holds them."""
_shared_lock = threading.Lock()


def learning_config(settings: Settings) -> LearningConfig | None:
    """`GATEWAY_LEARNING__*` as the router's `LearningConfig`; None when learning is off."""
    return learning_parameters(settings.learning) if settings.learning.enabled else None


def learning_parameters(s: LearningSettings) -> LearningConfig:
    """The numbers of `GATEWAY_LEARNING__*`, whether learning is enabled or not (for `eval --replay`)."""
    return LearningConfig(
        max_boost=s.max_boost,
        max_penalty=s.max_penalty,
        max_prior=s.max_prior,
        half_life_days=s.half_life_days,
        min_similarity=s.min_similarity,
        half_weight_signals=s.half_weight_signals,
        max_signals=s.max_signals,
    )


def build_router(settings: Settings, pm: PluginManager | None) -> Router:
    """The configured router: the embedder (or BM25 alone), the embedding cache (SQLite in the
    data dir, or the PostgreSQL database of `GATEWAY_DATABASE_URL`, shared by replicas), learning."""
    from gateway.router.cache import open_embedding_cache
    from gateway.router.index import Router

    embedder = load_router_embedder(settings, pm)
    cache = open_embedding_cache(settings.database_url, settings.data_dir) if embedder is not None else None
    return Router(embedder, cache=cache, learning=learning_config(settings))


def records_from_registry(registry: ToolSource) -> list[ToolRecord]:
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


LATE_SIGNAL_SECONDS = 120.0
"""How late a signal may reach the source after it happened (buffered writes) and still be
read: each read asks for signals since the newest one seen minus this, and skips those
already learnt."""


class SignalCursor:
    """Which signals were already read, so that each read learns only new ones.

    A source returns signals at or after `since`; writes may land late, so reads overlap
    by `LATE_SIGNAL_SECONDS` and the signals of the overlap already seen are skipped. A
    source that knows how late its writes can be (`signal_horizon()`, the records: no
    signal before that time can still land) narrows the overlap to that time, never
    widening it. What the cursor remembers of the overlap is each signal's hash and time,
    not the signal: at 200 calls a second a two-minute overlap was 24,000 signals, kept
    and re-read every refresh, which ratcheted a soaking gateway's memory up by tens of
    MB and stalled its calls at each read.
    """

    def __init__(self) -> None:
        self.since: float | None = None
        self._seen: dict[int, float] = {}
        """hash(signal) -> its time, for the signals at or after `since`."""

    def new(self, signals: Sequence[UsageSignal], horizon: float | None = None) -> list[UsageSignal]:
        """The signals of a read not returned before; moves the cursor past them, and up to `horizon`
        (taken before the read) if the source gave one."""
        seen = self._seen
        fresh = []
        newest: float | None = None
        for s in signals:
            key = hash(s)
            if key not in seen:
                seen[key] = s.at
                fresh.append(s)
            if newest is None or s.at > newest:
                newest = s.at
        bounds = [t for t in (None if newest is None else newest - LATE_SIGNAL_SECONDS, horizon) if t is not None]
        if bounds and (self.since is None or max(bounds) > self.since):
            self.since = max(bounds)
        if self.since is not None:
            floor = self.since
            self._seen = {key: at for key, at in seen.items() if at >= floor}
        return fresh

    def __len__(self) -> int:
        """Signals remembered from the overlap."""
        return len(self._seen)


class RouterService:
    """Owns the `Router` of a running gateway. Start `run()` in the registry's task group.

    `signals` is where the router learns from (the records store); None: it does not.
    """

    def __init__(
        self,
        registry: ToolSource,
        settings: Settings,
        make_router: Callable[[], Router],
        signals: SignalSource | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.make_router = make_router
        self.signals = signals
        self.router: Router | None = None
        self.ready = anyio.Event()
        """Set once the first index is built (BM25 at first)."""
        self.complete = anyio.Event()
        """Set once the full router (with the embedding model, when there is one) serves and
        the full texts of the first index's tools are embedded."""
        self._dirty = anyio.Event()
        self._enrich_wanted = anyio.Event()
        self._built = False
        """True once the full router was built (or could not be): `complete` waits for it."""
        self._lock = anyio.Lock()
        self._cursor = SignalCursor()
        self._learning_router: Router | None = None
        """The router the cursor's signals were learnt by (a new router learns them all again)."""
        self._wake_learning = anyio.Event()
        self._source_failing = False
        self.learnt = 0
        """Signals learnt so far by the current router."""
        self._refreshing = anyio.Lock()
        self._last_status: str | None = None
        registry.change_listeners.append(self._on_change)

    def figures(self) -> RouterFigures:
        """The router's embedding work, for a metrics scrape (`GatewayMetrics.watch_router`)."""
        router = self.router
        if router is None:
            return RouterFigures(semantic=False, embedded=0, cached=0, pending=0)
        return RouterFigures(
            semantic=router.dense and not router.degraded,  # 0 while an embedding endpoint is down
            embedded=router.embedded_documents,
            cached=router.cached_documents,
            pending=router.pending_documents,
        )

    async def _on_change(self, kinds: set[str]) -> None:
        if "tools" in kinds:
            self._dirty.set()

    async def run(self) -> None:
        """Index with BM25 at once, then load the model and switch to the full router.

        Searches work from the first second (lexically), and get semantic as soon as
        the model is loaded and the tools embedded. Never raises: a router that cannot
        be built or updated leaves the gateway serving, and search says it is unavailable.
        """
        async with anyio.create_task_group() as tg:
            if self.signals is not None and self.settings.learning.enabled:
                tg.start_soon(self._learn_forever, name="router-learning")
            tg.start_soon(self._enrich_forever, name="router-full-texts")
            await self._index_forever()

    async def _index_forever(self) -> None:
        from gateway.router.index import Router

        # The first index covers the servers that connect at start-up (bounded wait);
        # later ones are added when they announce their tools.
        await self.registry.wait_settled(self.settings.list_wait)
        self.router = Router(None, learning=learning_config(self.settings))
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
                self._wake_learning.set()  # the new router learns what the first one had learnt
        except Exception:  # noqa: BLE001 - boundary: lexical search goes on without the model
            logger.exception("router: the embedding index could not be built; searching with BM25 alone")
        self._built = True
        self._note_status()
        self._enrich_wanted.set()
        logger.info(
            "router: %s, ready in %.1f s (%d tool documents embedded, %d from the embedding cache)",
            self.router.status,
            time.perf_counter() - started,
            self.router.embedded_documents,
            self.router.cached_documents,
        )
        while True:
            current = self.router
            if current is not None and current.needs_embedding:
                # indexed without vectors while the embedder failed: try again now and then
                with anyio.move_on_after(self.settings.embedding.retry_seconds):
                    await self._dirty.wait()
            else:
                await self._dirty.wait()
            self._dirty = anyio.Event()
            await self._sync_logged()

    async def _sync_logged(self) -> None:
        try:
            await self.sync()
        except Exception:  # noqa: BLE001 - boundary: keep the last good index and keep serving
            logger.exception("router: updating the index failed; searching the previous one")
        self.ready.set()

    @property
    def status(self) -> str:
        """How searches are ranked now (`Router.status`), or that the first index is not built yet."""
        return self.router.status if self.router is not None else "starting"

    def _note_status(self) -> None:
        """Log when the ranking falls back to BM25 (an embedding endpoint down) and when it recovers."""
        status = self.status
        if status == self._last_status:
            return
        previous, self._last_status = self._last_status, status
        router = self.router
        if router is not None and router.degraded:
            logger.warning("router: %s (searches answer meanwhile)", status)
        elif previous is not None and "unavailable" in previous:
            logger.info("router: the embedding model answers again; %s", status)

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
        self._note_status()
        self.ready.set()
        self._enrich_wanted.set()

    async def _enrich_forever(self) -> None:
        """Embed the tools' full texts after each update, in a worker thread; sets `complete` after the first."""
        while True:
            await self._enrich_wanted.wait()
            self._enrich_wanted = anyio.Event()
            router = self.router
            if router is not None and router.dense:
                await self._enrich(router)
            if self._built:  # not after the first, lexical index
                self.complete.set()

    async def _enrich(self, router: Router) -> None:
        stop = threading.Event()  # a cancelled wait stops the thread after its current batch
        started = time.perf_counter()
        progress = TerminalProgress("mcp-gateway: embedding the tools' full texts")
        try:
            done = await anyio.to_thread.run_sync(
                lambda: router.enrich(progress=progress, stop=stop), abandon_on_cancel=True
            )
        except Exception:  # noqa: BLE001 - boundary: the short texts' vectors keep serving
            logger.exception("router: embedding the tools' full texts failed; ranking with their short texts")
            return
        finally:
            stop.set()
        if done:
            logger.info("router: %d tools' full texts embedded in %.1f s", done, time.perf_counter() - started)

    async def search(self, query: str, k: int, threshold: float) -> list[SearchHit]:
        """Rank the catalog's tools for `query`, waiting (bounded) for the first index."""
        with anyio.fail_after(self.settings.routing.search_timeout):
            await self.ready.wait()
            router = self.router
            if router is None:
                raise RouterUnavailable("Tool search is unavailable on this gateway (see its log).")
            hits = await anyio.to_thread.run_sync(
                lambda: router.search(query, k=k, threshold=threshold), abandon_on_cancel=True
            )
        self._note_status()
        return hits

    # ------------------------------------------------------------------ learning

    async def _learn_forever(self) -> None:
        await self.ready.wait()
        while True:
            try:
                await self.refresh_signals()
            except EmbeddingUnavailable as e:
                logger.warning("router: learning waits for the embedding model (%s)", e)
            except Exception:  # noqa: BLE001 - boundary: learning must never stop the gateway
                logger.exception("router: learning from usage signals failed; the ranking is unchanged")
            with anyio.move_on_after(self.settings.learning.refresh_seconds):
                await self._wake_learning.wait()
            self._wake_learning = anyio.Event()

    async def refresh_signals(self) -> int:
        """Read the signals recorded since the last read and learn them; returns how many were new.

        A source that fails is logged once (then at debug level until it works again) and
        read again at the next refresh; searching is never affected. Refreshes run one at a
        time: one that found nothing new while another was still learning what it had taken
        would return before those signals were learnt.
        """
        async with self._refreshing:
            return await self._refresh_signals()

    async def _refresh_signals(self) -> int:
        router = self.router
        if self.signals is None or router is None or router.usage is None:
            return 0
        if router is not self._learning_router:
            self._cursor = SignalCursor()
            self._learning_router = router
            self.learnt = 0
        horizon = getattr(self.signals, "signal_horizon", None)
        try:
            before = horizon() if callable(horizon) else None  # before the read: what lands later is newer
            read = await self.signals.usage_signals(self._cursor.since)
        except Exception:  # noqa: BLE001 - boundary: the source is another component; retry later
            if not self._source_failing:
                logger.warning(
                    "router: reading usage signals failed; retrying every %g s",
                    self.settings.learning.refresh_seconds,
                    exc_info=True,
                )
            else:
                logger.debug("router: reading usage signals failed again", exc_info=True)
            self._source_failing = True
            return 0
        if self._source_failing:
            logger.info("router: reading usage signals works again")
            self._source_failing = False
        fresh = self._cursor.new(read, before)
        if fresh:
            embedded = await anyio.to_thread.run_sync(lambda: router.learn(fresh))
            self.learnt += len(fresh)
            logger.debug("router: learnt %d signals (%d new queries embedded)", len(fresh), embedded)
        return len(fresh)
