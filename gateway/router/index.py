"""The semantic router's index: each tool's embedding and BM25 terms, and the ranking.

`Router.update` makes the index reflect a list of `ToolRecord`s, embedding only the
documents it has not seen (vectors are reused from memory, then from the on-disk
cache); `Router.search` ranks the tools for a request. Vectors are the rows of one
float32 matrix searched exactly: a matrix-vector product over 10,000 tools takes about
a millisecond, so no approximate index is needed at the sizes a gateway sees.

Each tool has two texts: a short one (`dense_document`: name, start of the description,
server name) and its full document cut at 128 word pieces (`tool_document`: parameters,
server description too). Its vector is the mean of the two texts' vectors, so its cosine
is the mean of the two cosines. `update` embeds the short texts, which makes the index
searchable; `enrich` then embeds the full texts, about 3.5 times the work, and swaps the
vectors in as they come (a tool whose full text is not embedded yet has its short
vector alone). The gateway runs `enrich` in the background after each update.

Ranking (the default, `RouterConfig()`): a weighted sum of two scores in 0..1,

    score = 0.5 * max(0, cosine(compact_query(query), tool)) + 0.5 * BM25(query, tool) / BM25_max(query)

where `BM25_max` bounds what a tool containing every query term could score, so the BM25
part is "how much of the request the tool's text covers". Both parts are absolute, not
normalized per query, so a score means the same thing from one query to the next and a
threshold is meaningful; and when the request's wording shares nothing with a tool's
text, BM25 adds nothing and the ranking is the embedding's. The model reads
`compact_query(query)` (paths as their kind, no stopwords: shorter, so faster, and as
good), BM25 the request as written. A long request (three sentences or more) is also
ranked step by step, one sentence each, and the rankings are merged taking turns, the
whole request's first: a paragraph of 3-5 steps no longer loses its later ones to the
whole request's single vector (issue 20). The alternatives measured (reciprocal rank
fusion, either signal alone, server-level boosts, other merges, the short text alone)
are selectable with `RouterConfig`; `bench/router_variants.py` measures each.

A router built with a `LearningConfig` also learns from use (`learn`): what it learnt
(`gateway.router.learning`) is added to each tool's score before the top-k cut, and the
sum is clipped to 0..1; without signals the ranking is exactly the one above.

Each update builds a new immutable snapshot and swaps it in with one assignment, so
searches may run on another thread while an update is in progress.
"""

from __future__ import annotations

import threading
import time
from collections import ChainMap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from gateway.router import fusion
from gateway.router.base import (
    Embedder,
    EmbeddingCache,
    EmbeddingUnavailable,
    Matrix,
    SearchHit,
    ToolRecord,
    Vector,
    bulk_size,
)
from gateway.router.bm25 import BM25Index
from gateway.router.cache import cache_key
from gateway.router.documents import dense_document, server_document, tool_document, truncate_tokens
from gateway.router.learning import LearningConfig, UsageModel, lexical_vector
from gateway.router.query import compact_query
from gateway.router.router_config import RouterConfig
from gateway.router.signals import UsageSignal
from gateway.router.snapshot import Snapshot
from gateway.router.steps import split_query

__all__ = ["EMBED_BATCH", "ENRICH_BATCH", "Router"]

EMBED_BATCH = 32
"""Documents per `embed_documents` call during an update (one progress step each), at least."""

ENRICH_BATCH = 1
"""Full texts per `embed_documents` call during `Router.enrich` for an embedder without
document workers: a search waiting for the model then waits for one text at most."""

ENRICH_SWAP_SECONDS = 2.0
"""How often `enrich` swaps in the vectors embedded so far (each swap copies the matrix)."""


class Router:
    """Ranks tools for a request: embeddings and BM25, fused (see `RouterConfig`).

    With `embedder=None` it ranks with BM25 alone (`dense` is False). With `learning`, it
    learns from usage signals (`learn`) and adjusts its ranking by what it learnt.
    """

    def __init__(
        self,
        embedder: Embedder | None,
        *,
        cache: EmbeddingCache | None = None,
        config: RouterConfig | None = None,
        learning: LearningConfig | None = None,
    ) -> None:
        self._embedder = embedder
        self._cache = cache
        self.config = config or RouterConfig()
        self.usage = UsageModel(learning) if learning is not None else None
        """What use taught this router; None: it does not learn."""
        self._snapshot = Snapshot()
        self._vectors: dict[str, Vector] = {}
        """The vectors of the indexed short texts (and server documents), by cache key."""
        self._full_vectors: dict[str, Vector] = {}
        """The vectors of the indexed tools' full texts embedded so far, by cache key."""
        self._update_lock = threading.Lock()
        self.embedded_documents = 0
        """How many documents this router has embedded itself (not found in memory or cache)."""
        self.cached_documents = 0
        """How many documents' vectors this router found in the embedding cache instead."""
        self.embedding_failure: str | None = None
        """Why the embedder failed last (an endpoint down), while it does; None when it works."""

    @property
    def dense(self) -> bool:
        """True when searches use the embedding model; False: BM25 alone."""
        return self._embedder is not None and self.config.fusion != "bm25"

    @property
    def degraded(self) -> bool:
        """True while the embedder fails (an endpoint down): searches are ranked with BM25 alone."""
        return self._embedder is not None and self.embedding_failure is not None

    @property
    def needs_embedding(self) -> bool:
        """True when the index was built without vectors because the embedder failed: an `update`
        with the same tools embeds them once the embedder answers again."""
        snap = self._snapshot
        return self.degraded and snap.matrix is None and bool(snap.records)

    @property
    def status(self) -> str:
        """How searches are ranked now, in a line: `embeddings + BM25`, `BM25 only`, or why BM25 only."""
        if self._embedder is None or self.config.fusion == "bm25":
            return "BM25 only"
        if self.embedding_failure is not None:
            return f"BM25 only while the embedding model is unavailable: {self.embedding_failure}"
        return "embeddings + BM25"

    def _embedding_failed(self, error: EmbeddingUnavailable) -> None:
        self.embedding_failure = str(error) or type(error).__name__

    @property
    def description(self) -> str:
        """The ranking in a few words, e.g. `weighted(dense=0.5,bm25=0.5)`."""
        return self.config.describe(self._embedder is not None)

    def __len__(self) -> int:
        return len(self._snapshot.records)

    @property
    def names(self) -> list[str]:
        """The indexed tools' names, sorted."""
        return list(self._snapshot.names)

    # ------------------------------------------------------------------ update

    def update(self, records: Sequence[ToolRecord], progress: Callable[[int, int], None] | None = None) -> None:
        """Make the index hold exactly `records` (unique names).

        Only documents not embedded before are embedded: vectors are reused from memory,
        then from the cache. `progress(done, total)` counts the documents that do need
        embedding: it is called with `(0, total)` before the first batch and after each
        batch, and not at all when nothing needs embedding. Synchronous (CPU-bound for
        seconds on a cold start): run it in a worker thread. Searches during an update
        see the previous index.
        """
        names = [r.name for r in records]
        if len(set(names)) != len(names):
            raise ValueError("duplicate tool names in a router update")
        with self._update_lock:
            cfg = self.config
            old = self._snapshot
            ordered = sorted(records, key=lambda r: r.name)
            documents = [tool_document(r) for r in ordered]
            bm25 = BM25Index.build(
                list(zip((r.name for r in ordered), documents, strict=True)), k1=cfg.k1, b=cfg.b, previous=old.bm25
            )
            texts = [dense_document(r) for r in ordered]
            server_of = np.zeros(len(ordered), dtype=np.intp)
            server_bm25: BM25Index | None = None
            server_texts: list[str] = []
            if cfg.server_weight:
                server_ids = sorted({r.server_id for r in ordered})
                position = {s: i for i, s in enumerate(server_ids)}
                server_of = np.array([position[r.server_id] for r in ordered], dtype=np.intp)
                members: dict[str, list[ToolRecord]] = {s: [] for s in server_ids}
                for r in ordered:
                    members[r.server_id].append(r)
                server_texts = [server_document(members[s]) for s in server_ids]
                server_bm25 = BM25Index.build(
                    list(zip(server_ids, server_texts, strict=True)), k1=cfg.k1, b=cfg.b, previous=old.server_bm25
                )
            short_matrix: Matrix | None = None
            server_matrix: Matrix | None = None
            full_texts: tuple[str, ...] = ()
            full_keys: tuple[str, ...] = ()
            if self._embedder is not None and cfg.fusion != "bm25":
                try:
                    vectors = self._embed_all(texts + server_texts, progress)
                    short_matrix = vectors[: len(texts)]
                    server_matrix = vectors[len(texts) :] if server_texts else None
                    if cfg.full_document_weight:
                        full_texts = tuple(truncate_tokens(d, cfg.full_document_tokens) for d in documents)
                        full_keys = tuple(cache_key(self._embedder.model_id, t) for t in full_texts)
                    # a full text that is also a short text (nothing but a short description) has its vector
                    self._full_vectors = self._known(full_keys, ChainMap(self._full_vectors, self._vectors))
                    self.embedding_failure = None
                except EmbeddingUnavailable as e:  # indexed for BM25 alone; `needs_embedding` says so
                    self._embedding_failed(e)
                    short_matrix = server_matrix = None
                    full_texts = full_keys = ()
            matrix, blended = self._blend(short_matrix, full_keys)
            self._snapshot = Snapshot(
                records=tuple(ordered),
                names=tuple(r.name for r in ordered),
                matrix=matrix,
                short_matrix=short_matrix,
                full_keys=full_keys,
                full_texts=full_texts,
                blended=blended,
                bm25=bm25,
                server_of=server_of,
                server_matrix=server_matrix,
                server_bm25=server_bm25,
                row_of={r.name: i for i, r in enumerate(ordered)},
            )

    def _known(self, keys: Sequence[str], memory: Mapping[str, Vector]) -> dict[str, Vector]:
        """The vectors of these keys already known, from `memory`, then from the cache (none embedded)."""
        found = {k: memory[k] for k in keys if k in memory}
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing and self._cache is not None:
            from_cache = self._cache.get_many(missing)
            self.cached_documents += len(from_cache)
            found.update(from_cache)
        return found

    def _blend(self, short: Matrix | None, full_keys: Sequence[str]) -> tuple[Matrix | None, int]:
        """The searched matrix: each row blended with its full text's vector when there is one."""
        if short is None or not full_keys:
            return short, 0
        w = self.config.full_document_weight
        rows = [i for i, key in enumerate(full_keys) if key in self._full_vectors]
        if not rows:
            return short, 0
        matrix = short.copy()
        full = np.stack([self._full_vectors[full_keys[i]] for i in rows])
        matrix[rows] = (1.0 - w) * short[rows] + w * full
        return matrix, len(rows)

    @property
    def pending_documents(self) -> int:
        """Indexed tools whose full text has no vector yet (what `enrich` would embed)."""
        snap = self._snapshot
        return sum(1 for key in snap.full_keys if key not in self._full_vectors)

    def enrich(self, progress: Callable[[int, int], None] | None = None, stop: threading.Event | None = None) -> int:
        """Embed the full texts of the indexed tools that have no vector yet; returns how many.

        The index stays searchable throughout: the vectors embedded so far are swapped in
        (and written to the cache) every `ENRICH_SWAP_SECONDS` and at the end. An `update`
        meanwhile is taken into account: its new tools are embedded too, removed ones
        skipped. `progress(done, total)` is called as in `update`. Setting `stop` ends it
        after the current batch.
        Synchronous (CPU-bound for seconds to minutes): run it in a worker thread.
        """
        embedder = self._embedder
        if embedder is None or not self.dense or not self.config.full_document_weight:
            return 0
        done = 0
        unsaved: dict[str, Vector] = {}
        last_swap = time.monotonic()
        try:
            while stop is None or not stop.is_set():
                snap = self._snapshot
                texts = dict(zip(snap.full_keys, snap.full_texts, strict=True))
                todo = sorted(
                    ((k, t) for k, t in texts.items() if k not in self._full_vectors), key=lambda item: len(item[1])
                )
                if not todo:
                    break
                total = done + len(todo)
                if progress is not None:
                    progress(done, total)
                step = bulk_size(embedder, ENRICH_BATCH)
                for start in range(0, len(todo), step):
                    if (stop is not None and stop.is_set()) or self._snapshot is not snap:
                        break
                    batch = todo[start : start + step]
                    try:
                        embedded = self._embed_batch([t for _, t in batch])
                    except EmbeddingUnavailable as e:  # the short texts' vectors keep serving
                        self._embedding_failed(e)
                        return done
                    new = dict(zip([k for k, _ in batch], embedded, strict=True))
                    unsaved.update(new)
                    with self._update_lock:
                        self._full_vectors.update(new)
                        self.embedded_documents += len(batch)
                    done += len(batch)
                    if progress is not None:
                        progress(done, total)
                    if time.monotonic() - last_swap >= ENRICH_SWAP_SECONDS:
                        self._save(unsaved)
                        self._swap_blended()
                        last_swap = time.monotonic()
        finally:
            self._save(unsaved)
            self._swap_blended()
        return done

    def _save(self, vectors: dict[str, Vector]) -> None:
        """Write `vectors` to the cache (if any) and empty the dict."""
        if vectors and self._cache is not None:
            self._cache.put_many(dict(vectors))
        vectors.clear()

    def _swap_blended(self) -> None:
        """Put the full-text vectors known now into the searched matrix."""
        with self._update_lock:
            snap = self._snapshot
            matrix, blended = self._blend(snap.short_matrix, snap.full_keys)
            if blended != snap.blended:
                self._snapshot = replace(snap, matrix=matrix, blended=blended)

    def _embed_batch(self, texts: Sequence[str]) -> Matrix:
        embedder = self._embedder
        assert embedder is not None
        vectors = np.asarray(embedder.embed_documents(list(texts)), dtype=np.float32)
        if vectors.shape != (len(texts), embedder.dim):
            raise ValueError(f"the embedder returned shape {vectors.shape}, not {(len(texts), embedder.dim)}")
        return vectors

    def _embed_all(self, documents: Sequence[str], progress: Callable[[int, int], None] | None) -> Matrix:
        embedder = self._embedder
        assert embedder is not None
        model_id = embedder.model_id
        keys = [cache_key(model_id, d) for d in documents]
        found = self._known(keys, self._vectors)
        missing = [k for k in dict.fromkeys(keys) if k not in found]
        if missing:
            text_of = dict(zip(keys, documents, strict=True))
            missing.sort(key=lambda k: len(text_of[k]))  # similar lengths per batch: less padding
            total = len(missing)
            if progress is not None:
                progress(0, total)
            step = bulk_size(embedder, EMBED_BATCH)
            for start in range(0, total, step):
                batch = missing[start : start + step]
                new = dict(zip(batch, self._embed_batch([text_of[k] for k in batch]), strict=True))
                found.update(new)
                self.embedded_documents += len(batch)
                if self._cache is not None:
                    self._cache.put_many(new)
                if progress is not None:
                    progress(start + len(batch), total)
        self._vectors = {k: found[k] for k in keys}
        if not keys:
            return np.zeros((0, embedder.dim), dtype=np.float32)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)

    # ------------------------------------------------------------------ search

    def search(self, query: str, k: int = 8, threshold: float = 0.0, *, learned: bool = True) -> list[SearchHit]:
        """The `k` best tools for `query` that score at least `threshold`, best first.

        Scores are in 0..1; equal scores are ordered by tool name, so the first `k` of a
        longer list are the list for `k`. What the router learnt from use (`learn`) is
        added to each tool's score before the cut, then scores are clipped to 0..1;
        `learned=False` ranks as if nothing had been learnt. Raises ValueError for an
        empty query or k < 1.
        """
        if not query or not query.strip():
            raise ValueError("the search query is empty")
        if k < 1:
            raise ValueError("k must be at least 1")
        snap = self._snapshot
        n = len(snap.records)
        if n == 0:
            return []
        query = query.strip()
        cfg = self.config
        queries = [query]
        if cfg.split != "off":
            steps = split_query(query, clauses=cfg.split == "clauses")
            if len(steps) > 1 and len(steps) >= cfg.split_min_steps:
                queries.extend(steps)
        vectors: Matrix | None = None
        if self._uses_dense(snap):
            try:
                vectors = self._embed_queries([self._embedded_text(q) for q in queries])
                self.embedding_failure = None
            except EmbeddingUnavailable as e:  # this search is ranked with BM25 alone, never an error
                self._embedding_failed(e)
        scores = self._scores(snap, queries, vectors)
        # what was learnt is keyed by the model's vectors: none without them
        if learned and self.usage is not None and len(self.usage) and (vectors is not None or not self.dense):
            learnt = self.usage.adjustments(vectors[0] if vectors is not None else lexical_vector(query))
            self._adjust(snap, scores, learnt)
        k = min(k, n)
        if len(queries) == 1:
            picked = [(int(i), float(scores[0, i])) for i in fusion.top(scores[0], k)]
        elif cfg.merge == "round_robin":
            picked = fusion.round_robin(scores, k)
        elif cfg.merge == "share":
            picked = fusion.share(scores[1:], k)
        else:
            best = scores[1:].max(axis=0)
            merged = np.maximum(scores[0], best) if cfg.merge == "max" else (scores[0] + best) / 2
            picked = [(int(i), float(merged[i])) for i in fusion.top(merged, k)]
        return [
            SearchHit(name=snap.names[i], score=min(1.0, max(0.0, s)), record=snap.records[i])
            for i, s in picked
            if s >= threshold
        ]

    # ------------------------------------------------------------------ learning

    def learn(self, signals: Sequence[UsageSignal]) -> int:
        """Add usage signals to what this router learnt; returns how many new queries were embedded.

        Only queries not seen before are embedded (through the embedding cache, when there
        is one). Synchronous (it may run the model): call it from a worker thread.
        Searches running meanwhile use what was learnt before.
        """
        usage = self.usage
        if usage is None:
            raise RuntimeError("this router was built without learning")
        new = usage.new_queries(signals)
        usage.add(signals, dict(zip(new, self._signal_vectors(new), strict=True)))
        return len(new)

    def forget(self) -> None:
        """Drop everything learnt (the configuration stays)."""
        if self.usage is not None:
            self.usage = UsageModel(self.usage.config)

    def _signal_vectors(self, queries: Sequence[str]) -> list[Vector]:
        """The vectors signal queries are compared by: as a search embeds them, or lexical ones."""
        if not queries:
            return []
        if not self.dense or self._embedder is None:
            return [lexical_vector(q) for q in queries]
        texts = [self._embedded_text(q.strip()) for q in queries]
        model_id = self._embedder.model_id
        keys = [cache_key(model_id, "query\0" + t) for t in texts]
        found = dict(self._cache.get_many(keys)) if self._cache is not None else {}
        todo = [(key, text) for key, text in dict(zip(keys, texts, strict=True)).items() if key not in found]
        for start in range(0, len(todo), EMBED_BATCH):
            batch = todo[start : start + EMBED_BATCH]
            new = dict(zip([key for key, _ in batch], self._embed_queries([t for _, t in batch]), strict=True))
            found.update(new)
            if self._cache is not None:
                self._cache.put_many(new)
        return [found[key] for key in keys]

    def _adjust(self, snap: Snapshot, scores: npt.NDArray[np.float32], learnt: dict[str, float]) -> None:
        """Add each tool's learnt adjustment to its scores (every row), clipped to 0..1."""
        rows = [(snap.row_of[name], value) for name, value in learnt.items() if name in snap.row_of]
        if not rows:
            return
        columns = np.array([row for row, _ in rows], dtype=np.intp)
        scores[:, columns] = np.clip(scores[:, columns] + np.array([v for _, v in rows], dtype=np.float32), 0.0, 1.0)

    def _uses_dense(self, snap: Snapshot) -> bool:
        return snap.matrix is not None and self.config.fusion != "bm25"

    def _embedded_text(self, query: str) -> str:
        return query if self.config.query_text == "raw" else compact_query(query)

    def _embed_queries(self, texts: Sequence[str]) -> Matrix:
        embedder = self._embedder
        assert embedder is not None
        if len(texts) == 1:
            return np.asarray(embedder.embed_query(texts[0]), dtype=np.float32)[None, :]
        batch = getattr(embedder, "embed_queries", None)  # one call for many, if the embedder has it
        if callable(batch):
            return np.asarray(batch(list(texts)), dtype=np.float32)
        return np.stack([np.asarray(embedder.embed_query(t), dtype=np.float32) for t in texts])

    def _scores(self, snap: Snapshot, queries: Sequence[str], vectors: Matrix | None) -> npt.NDArray[np.float32]:
        """Tool scores in 0..1, one row per query; `vectors` are the queries' embeddings (dense only)."""
        cfg = self.config
        use_dense = vectors is not None
        use_bm25 = not use_dense or cfg.fusion != "dense"
        servers = cfg.server_weight > 0 and snap.server_bm25 is not None
        n_servers = len(snap.server_bm25) if snap.server_bm25 is not None else 0
        bm25 = np.zeros((len(queries), len(snap.records)), dtype=np.float32)
        server_bm25 = np.zeros((len(queries), n_servers), dtype=np.float32)
        if use_bm25:
            for i, q in enumerate(queries):
                bm25[i] = fusion.coverage(snap.bm25, q)
                if servers:
                    assert snap.server_bm25 is not None
                    server_bm25[i] = fusion.coverage(snap.server_bm25, q)
        if not use_dense:
            tool: npt.NDArray[np.floating] = bm25
            server: npt.NDArray[np.floating] = server_bm25
        else:
            assert snap.matrix is not None and vectors is not None
            cosine = np.clip(fusion.dot(vectors, snap.matrix), 0.0, 1.0)
            server_cosine = (
                np.clip(fusion.dot(vectors, snap.server_matrix), 0.0, 1.0)
                if servers and snap.server_matrix is not None
                else np.zeros_like(server_bm25)
            )
            if cfg.fusion == "dense":
                tool = cosine
                server = server_cosine
            elif cfg.fusion == "weighted":
                w = cfg.dense_weight
                tool = w * cosine + (1 - w) * bm25
                server = w * server_cosine + (1 - w) * server_bm25
            else:
                tool = fusion.rrf(cfg.rrf_k, cosine, bm25)
                server = fusion.rrf(cfg.rrf_k, server_cosine, server_bm25) if servers else server_bm25
        if servers and server.shape[1]:
            tool = (tool + cfg.server_weight * server[:, snap.server_of]) / (1.0 + cfg.server_weight)
        return np.asarray(tool, dtype=np.float32)
