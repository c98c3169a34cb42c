"""The router's shared vocabulary: what is indexed, what a search returns, what embeds text.

Kept apart from the implementations so that the index, the embedder, the cache and
the server can each be built and tested against these types alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import mcp_types as types
import numpy as np
import numpy.typing as npt

__all__ = [
    "BULK_ROUNDS",
    "Embedder",
    "EmbeddingCache",
    "EmbeddingUnavailable",
    "SearchHit",
    "ToolRecord",
    "Vector",
    "Matrix",
    "bulk_size",
]

Vector = npt.NDArray[np.float32]
"""One L2-normalized embedding, shape (dim,)."""
Matrix = npt.NDArray[np.float32]
"""L2-normalized embeddings, one per row, shape (n, dim)."""


@dataclass(frozen=True)
class ToolRecord:
    """One tool as the router sees it: the exposed tool and what describes its server."""

    name: str
    """The exposed (namespaced) name, e.g. `github__search_issues`."""
    server_id: str
    tool: types.Tool
    """The tool as exposed downstream (its `name` is `name`)."""
    original_name: str = ""
    """The tool's name on its own server."""
    server_name: str = ""
    server_description: str = ""
    capabilities: tuple[str, ...] = ()
    """The server's free tags from the YAML `capabilities` key."""
    extra: tuple[str, ...] = ()
    """Text plugins add for the router (`gateway_enrich_tool`): synonyms, tasks, translations."""


@dataclass(frozen=True)
class SearchHit:
    """One ranked result. `score` is in 0..1, higher is better, comparable across queries."""

    name: str
    score: float
    record: ToolRecord


class EmbeddingUnavailable(Exception):
    """The embedder cannot embed now (an endpoint that is down, slow or answers nonsense); the
    message says why in one line. The router ranks with BM25 alone meanwhile (`Router.status`)."""


@runtime_checkable
class Embedder(Protocol):
    """Turns text into L2-normalized float32 vectors. Implementations must be thread-safe
    for sequential use from one worker thread at a time."""

    @property
    def model_id(self) -> str:
        """A stable id of the model and its weights, used in embedding-cache keys."""
        ...

    @property
    def dim(self) -> int: ...

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        """Embed many documents; returns shape (len(texts), dim)."""
        ...

    def embed_query(self, text: str) -> Vector:
        """Embed one search query; returns shape (dim,)."""
        ...


BULK_ROUNDS = 8
"""With document workers, batches per worker in one call (`bulk_size`): they rarely wait
for each other at the end of a call, and searches run beside them."""


def bulk_size(embedder: Embedder, minimum: int) -> int:
    """Texts per `embed_documents` call: at least `minimum`, or `BULK_ROUNDS` batches per
    worker for an embedder with document workers (`FastEmbedEmbedder.document_workers`)."""
    workers = int(getattr(embedder, "document_workers", 1) or 1)
    if workers <= 1:
        return minimum
    return max(minimum, workers * int(getattr(embedder, "batch_size", 1) or 1) * BULK_ROUNDS)


class EmbeddingCache(Protocol):
    """Embeddings on disk, keyed by a hash of model id + document text."""

    def get_many(self, keys: Sequence[str]) -> dict[str, Vector]:
        """The cached vectors among `keys` (missing keys are absent from the result)."""
        ...

    def put_many(self, items: Mapping[str, Vector]) -> None: ...
