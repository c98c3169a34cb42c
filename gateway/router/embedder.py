"""The router's embedding model: fastembed (ONNX Runtime) behind the `Embedder` protocol.

For the bundled model's layout (mean pooling), queries and batches run an ONNX session
and a tokenizer opened as fastembed opens them, directly (`gateway.router.pooling`; fastembed
itself loads neither unless `direct` is turned off; for the bundled model fastembed is not even
imported until then: its word pieces come from `gateway.router.wordpiece`), which is what cuts a
query at `max_query_tokens` without cutting documents. Documents in bulk (more than one
batch, once `DOCUMENT_SESSION_MIN_TEXTS` have come in one bulk) run on a second, single-threaded
session of the same model, one batch per core at once (`document_workers`): faster on a small
CPU, and a query no longer waits for them. A smaller bulk (a small catalog's cold index) runs
batch by batch on the query session, a query between two batches: the second session (57 MB,
a second or two to open) is not worth it there. The vectors are the same either way.

How a model is chosen and loaded, and what a failure to load does: `gateway.router.model_loading`.

Nothing here writes to stdout, which is the MCP channel in stdio mode.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.malloc import trim_heap
from gateway.router.base import Matrix, Vector
from gateway.router.bundled_model import (
    MODEL_FILE,
)
from gateway.router.pooling import MeanPoolingEncoder, fastembed_encoder, load_tokenizer, mean_pooling_encoder
from gateway.router.wordpiece import WordPieceTokenizer

if TYPE_CHECKING:
    pass

__all__ = [
    "DEFAULT_MODEL_NAME",
    "FastEmbedEmbedder",
    "available_cores",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
"""The fastembed model name whose layout, pooling (mean) and normalization the bundled model uses;
also the name used with `model_path` when `model` is unset."""


QUERY_PRIORITY_SECONDS = 1.0
"""How long a document batch waits for queries waiting for the model before it runs anyway."""

DOCUMENT_SESSION_MIN_TEXTS = 128
"""Texts in bulk, counted over the calls of one bulk (less than `DOCUMENT_SESSION_IDLE_SECONDS`
apart), from which the document session is opened. Two single-threaded runs side by side save
about a sixth of the time of one two-threaded run (2 cores), and opening the session costs 1-2 s
and 57 MB: below this, the query session runs them (the example config's 14 tools: never opened)."""

DOCUMENT_SESSION_IDLE_SECONDS = 30.0
"""How long the document session is kept after the last call in bulk: the calls of one cold index
come back to back, and a serving gateway gives the ~60 MB back (`GATEWAY_EMBEDDING__DOCUMENT_WORKERS`)."""


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity, where the OS tells it)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------- the embedder


class FastEmbedEmbedder:
    """An `Embedder` over `fastembed.TextEmbedding`.

    `model_dir` loads a local directory (fastembed's `specific_model_path`, no network);
    without it fastembed finds `model_name` in `cache_dir` or downloads it. The model is
    loaded and run once in the constructor (to learn `dim` and to fail here rather than at
    the first search), so the constructor raises whatever fastembed raises.

    Calls on the main session are serialized by a lock, so one instance may be used from
    any thread. Queries go first: document batches wait (up to `QUERY_PRIORITY_SECONDS`)
    while a query waits for the model. Documents in bulk (from `DOCUMENT_SESSION_MIN_TEXTS` in
    one bulk) run on their own single-threaded session, opened for them, by `document_workers`
    threads (default: one per core, or `threads`), and a query meanwhile runs beside the
    batches in progress, single-threaded on that session too, instead of after them; a smaller
    bulk runs on the main session batch by batch, a query between two batches. 1 runs every
    document on the main session, one batch at a time, as before (and costs no second session).
    """

    def __init__(
        self,
        model_name: str,
        *,
        model_id: str,
        model_dir: Path | None = None,
        cache_dir: Path | None = None,
        threads: int | None = None,
        batch_size: int = 8,
        max_query_tokens: int = 64,
        document_workers: int | None = None,
        document_session_idle_seconds: float | None = None,
        bundled: bool = False,
        int8_matmul: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be at least 1")
        if document_workers is not None and document_workers < 1:
            raise ValueError("document_workers must be at least 1")
        self._fastembed_args: dict[str, Any] = {
            "model_name": model_name,
            "cache_dir": str(cache_dir) if cache_dir is not None else None,
            "threads": threads,
        }
        if model_dir is not None:
            self._fastembed_args["specific_model_path"] = str(model_dir)
        # The bundled model's layout (mean pooling, no query prefix) is run directly, on a session
        # and a tokenizer of our own: fastembed then loads neither unless it is run itself (`direct`).
        same_layout = model_name.lower() == DEFAULT_MODEL_NAME.lower()
        self._fastembed_args["lazy_load"] = same_layout
        self._text_embedding: Any = None
        """fastembed's `TextEmbedding`; for the bundled model made only if it is run (`direct` off)."""
        if not (bundled and model_dir is not None):
            self._text_embedding = self._fastembed()
        self._model_name = model_name
        self._model_id = model_id
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self._documents_lock = threading.Lock()
        self._in_bulk = False
        """True while documents in bulk run on the document session (queries then run there too)."""
        self._waiting_queries = 0
        self._queries_changed = threading.Condition()
        workers = document_workers or threads or available_cores()
        if bundled and model_dir is not None:  # no fastembed import: its tokenizer loader alone costs ~20 MB
            # word pieces in Python, the Rust tokenizer loaded only for a text it does not take (~13 MB)
            rust = partial(load_tokenizer, model_dir)
            tokenizer: Any = WordPieceTokenizer.for_model_dir(model_dir, rust) or rust()
            self._encoder: MeanPoolingEncoder | None = mean_pooling_encoder(
                model_dir / MODEL_FILE,
                tokenizer,
                max_query_tokens,
                threads=threads,
                document_workers=workers,
                int8_matmul=int8_matmul,  # the caller's `model_id` says so (`bundled_model.DEFAULT_EMBEDDER_ID`)
            )
        elif same_layout:
            self._encoder = fastembed_encoder(
                self._text_embedding, max_query_tokens, threads=threads, document_workers=workers
            )
        else:
            self._encoder = None
        self._document_workers = workers if self._encoder is not None and self._encoder.has_document_session else 1
        self._release_after = (
            DOCUMENT_SESSION_IDLE_SECONDS if document_session_idle_seconds is None else document_session_idle_seconds
        )
        self._last_bulk = time.monotonic()
        self._bulk_texts = 0
        """Texts in bulk since the bulk began (`DOCUMENT_SESSION_MIN_TEXTS`)."""
        self._release_timer: threading.Timer | None = None
        self._use_encoder = True
        probe = self._run(["warm-up"])
        self._dim = int(probe.shape[1])

    def _fastembed(self) -> Any:
        """fastembed's `TextEmbedding` of the model, made on first use."""
        if self._text_embedding is None:
            from fastembed import TextEmbedding  # imported only when fastembed runs the model (~20 MB)

            self._text_embedding = TextEmbedding(**self._fastembed_args)
        return self._text_embedding

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def model_name(self) -> str:
        """The fastembed model name (layout, pooling and normalization of the model)."""
        return self._model_name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def document_workers(self) -> int:
        """How many document batches run at once (1: one at a time, on the main session; also once
        the document session failed to open)."""
        if self._encoder is None or not self._encoder.has_document_session:
            return 1
        return self._document_workers

    @property
    def in_bulk(self) -> bool:
        """True while documents in bulk run on the document workers (queries then run beside them)."""
        return self._in_bulk

    @property
    def direct(self) -> bool:
        """True when the ONNX session is run directly (`gateway.router.pooling`), not through fastembed.

        Set it to False to go through fastembed (benchmarks compare the two)."""
        return self._encoder is not None and self._use_encoder

    @direct.setter
    def direct(self, value: bool) -> None:
        self._use_encoder = value

    def token_vectors(self, text: str, max_tokens: int) -> tuple[list[int], Matrix]:
        """`MeanPoolingEncoder.token_vectors` of the model (its word pieces and their unit hidden
        states); raises ValueError for a model that is not run directly (another layout)."""
        if self._encoder is None:
            raise ValueError(f"token vectors need a mean-pooling model run directly, not {self._model_name!r}")
        with self._lock:
            return self._encoder.token_vectors(text, max_tokens)

    def _worth_a_document_session(self, texts: int) -> bool:
        """Count `texts` into the current bulk (a new one after `document_session_idle_seconds`
        without); True if the document session is open or the bulk reached `DOCUMENT_SESSION_MIN_TEXTS`."""
        assert self._encoder is not None
        if time.monotonic() - self._last_bulk >= self._release_after:
            self._bulk_texts = 0
        self._bulk_texts += texts
        return self._encoder.document_session is not None or self._bulk_texts >= DOCUMENT_SESSION_MIN_TEXTS

    def _schedule_release(self) -> None:
        """Release the document session once no bulk call has come for `document_session_idle_seconds`
        (its weights are a second copy of the model, ~60 MB): a cold index keeps it, a serving
        gateway does not."""
        if self._encoder is None or self._encoder.document_session is None or self._release_timer is not None:
            return
        due = self._last_bulk + self._release_after - time.monotonic()
        # A weak reference: a pending release must not keep an embedder nobody uses alive.
        timer = threading.Timer(max(due, 0.0), _release_if_idle, args=(weakref.ref(self),))
        timer.daemon = True
        self._release_timer = timer
        timer.start()

    def release_if_idle(self) -> None:
        """Release the document session if no bulk call came for `document_session_idle_seconds`."""
        with self._documents_lock:
            self._release_timer = None
            if self._encoder is None:
                return
            if time.monotonic() - self._last_bulk >= self._release_after:
                self._encoder.release_document_session()
                trim_heap()  # its weights were freed in pieces: give the heap's free pages back
            else:
                self._schedule_release()

    @property
    def holds_document_session(self) -> bool:
        """Whether the document session (a second copy of the weights) is open now."""
        return self._encoder is not None and self._encoder.document_session is not None

    def _yield_to_queries(self) -> None:
        """Wait while queries wait for the model (bounded, so documents never starve)."""
        with self._queries_changed:
            self._queries_changed.wait_for(lambda: self._waiting_queries == 0, timeout=QUERY_PRIORITY_SECONDS)

    def _run(self, texts: list[str]) -> Matrix:
        if self.direct and self.document_workers > 1 and len(texts) > self._batch_size:
            assert self._encoder is not None
            with self._documents_lock:  # one bulk call at a time: its workers have the cores
                if self._worth_a_document_session(len(texts)) and self._encoder.open_document_session() is not None:
                    self._in_bulk = True
                    try:
                        return self._encoder.embed_documents(
                            texts, self._batch_size, workers=self._document_workers, before_batch=self._yield_to_queries
                        )
                    finally:
                        self._in_bulk = False
                        self._last_bulk = time.monotonic()
                        self._schedule_release()
                try:  # a small bulk: batch by batch on the query session, queries between the batches
                    return self._encoder.embed_documents(
                        texts, self._batch_size, before_batch=self._yield_to_queries, hold=self._lock
                    )
                finally:
                    self._last_bulk = time.monotonic()
        self._yield_to_queries()
        with self._lock:
            if self.direct:
                assert self._encoder is not None
                return self._encoder.embed_documents(texts, self._batch_size)  # batched by word pieces
            # fastembed batches texts in the order given: sorted by length, a batch is padded little.
            order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
            rows = list(self._fastembed().embed([texts[i] for i in order], batch_size=self._batch_size))
        result = np.empty((len(texts), rows[0].shape[-1]), dtype=np.float32)
        result[np.asarray(order, dtype=np.intp)] = _normalized(np.vstack(rows))
        return result

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        """Embed `texts`, in batches of texts of similar length; rows are in input order.

        Sorting by length keeps padding small: a batch is padded to its longest text, so one
        long description in a batch of short ones multiplies that batch's cost.
        """
        texts = list(texts)
        if not texts:
            return np.zeros((0, self._dim), dtype=np.float32)
        return self._run(texts)

    def embed_query(self, text: str) -> Vector:
        with self._queries_changed:
            self._waiting_queries += 1
        try:
            documents = self._encoder.document_session if self._encoder is not None else None
            if self.direct and self._in_bulk and documents is not None:
                # Documents in bulk have every core, one thread each: a two-threaded run
                # beside them stalls whenever one of its threads waits for a core, so the
                # query is one more single-threaded run on their session.
                assert self._encoder is not None
                return self._encoder.embed_query(text, session=documents)
            with self._lock:
                if self.direct:
                    assert self._encoder is not None
                    return self._encoder.embed_query(text)
                row = next(iter(self._fastembed().query_embed(text)))
        finally:
            with self._queries_changed:
                self._waiting_queries -= 1
                self._queries_changed.notify_all()
        return _normalized(np.asarray(row)[np.newaxis, :])[0]

    def __repr__(self) -> str:
        return f"FastEmbedEmbedder({self._model_name!r}, model_id={self._model_id!r}, dim={self._dim})"


def _normalized(matrix: Any) -> Matrix:
    """float32 rows of unit L2 norm (all-zero rows stay zero); fastembed normalizes most models
    already, but not every model it can load, and the protocol promises it."""
    m = np.asarray(matrix, dtype=np.float32)
    norms = np.linalg.norm(m, axis=-1, keepdims=True)
    return np.asarray(m / np.maximum(norms, np.float32(1e-12)), dtype=np.float32)


def _release_if_idle(embedder: weakref.ref[FastEmbedEmbedder]) -> None:
    """The release timer's target: nothing to do once the embedder is gone."""
    alive = embedder()
    if alive is not None:
        alive.release_if_idle()
