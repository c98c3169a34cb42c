"""The embedding cache: tool embeddings on disk in SQLite, so a restart embeds only what changed.
(`open_embedding_cache` picks PostgreSQL instead when the deployment has one: `cache_postgres`.)

Keys are `cache_key(model_id, document)`: a new model, or a changed tool description, is
simply a miss. Vectors are stored as little-endian float32 and come back bit-for-bit.

The cache is an optimization and never a reason for routing to fail: a file that cannot be
opened, is not a database, or breaks later is logged once as a warning and then ignored.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sqlite3
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from gateway.router.base import EmbeddingCache, Vector
from gateway.router.cache_rows import vector_of, vector_rows

__all__ = ["SqliteEmbeddingCache", "cache_key", "is_postgres_url", "open_embedding_cache"]

logger = logging.getLogger(__name__)

_CHUNK = 500
"""Keys per `IN (...)` query: well under SQLite's smallest variable limit (999)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS embeddings (
    key TEXT PRIMARY KEY,
    dim INTEGER NOT NULL,
    vector BLOB NOT NULL
)
"""


def is_postgres_url(url: str) -> bool:
    return url.lower().startswith(("postgresql://", "postgres://"))


def open_embedding_cache(database_url: str | None, data_dir: Path) -> EmbeddingCache:
    """The embedding cache of this deployment: PostgreSQL when `GATEWAY_DATABASE_URL` names one
    (shared by every replica), else `embeddings.sqlite` in the data dir (this machine's own)."""
    if not database_url:
        return SqliteEmbeddingCache(data_dir / "embeddings.sqlite")
    if is_postgres_url(database_url):
        from gateway.router.cache_postgres import PostgresEmbeddingCache

        return PostgresEmbeddingCache(database_url)
    raise ValueError(
        "GATEWAY_DATABASE_URL must be a postgresql:// URL (or unset, for SQLite files in the data dir); "
        f"got one starting with {database_url.split(':', 1)[0]!r}"
    )


def cache_key(model_id: str, document: str) -> str:
    """sha256 hex of `model_id + "\\0" + document`."""
    return hashlib.sha256(f"{model_id}\0{document}".encode()).hexdigest()


class SqliteEmbeddingCache:
    """An `EmbeddingCache` in the SQLite file `path` (WAL mode), created with its directory if need be.

    Each call opens its own connection, so the cache may be used from any thread; writes
    are additionally serialized within the process by a lock.
    """

    def __init__(self, path: Path, *, timeout: float = 10.0) -> None:
        self.path = Path(path)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._usable = True
        self._writable = True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as connection:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute(_SCHEMA)
                connection.execute("SELECT key, dim, vector FROM embeddings LIMIT 1").fetchall()
        except (sqlite3.Error, OSError) as e:
            self._disable(e)

    @property
    def usable(self) -> bool:
        """False once the file turned out unusable: every call is then a no-op (all misses)."""
        return self._usable

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        connection = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None)
        try:
            yield connection
        finally:
            connection.close()

    def _disable(self, error: BaseException) -> None:
        if self._usable:
            logger.warning(
                "router: the embedding cache %s is unusable (%s: %s); continuing without it, "
                "tools are embedded at every start (delete the file to have it rebuilt)",
                self.path,
                type(error).__name__,
                error,
            )
        self._usable = False

    def get_many(self, keys: Sequence[str]) -> dict[str, Vector]:
        found: dict[str, Vector] = {}
        if not self._usable or not keys:
            return found
        unique = list(dict.fromkeys(keys))
        try:
            with self._connect() as connection:
                for start in range(0, len(unique), _CHUNK):
                    chunk = unique[start : start + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    rows = connection.execute(
                        f"SELECT key, dim, vector FROM embeddings WHERE key IN ({marks})", chunk
                    ).fetchall()
                    for key, dim, blob in rows:
                        vector = vector_of(dim, blob)
                        if vector is not None:
                            found[key] = vector
        except (sqlite3.Error, OSError) as e:
            self._disable(e)
            return {}
        return found

    def put_many(self, items: Mapping[str, Vector]) -> None:
        if not self._usable or not self._writable or not items:
            return
        rows = vector_rows(items)
        try:
            with self._lock, self._connect() as connection:
                connection.execute("BEGIN IMMEDIATE")
                try:
                    connection.executemany(
                        "INSERT OR REPLACE INTO embeddings (key, dim, vector) VALUES (?, ?, ?)", rows
                    )
                except BaseException:
                    connection.execute("ROLLBACK")
                    raise
                connection.execute("COMMIT")
        except sqlite3.OperationalError as e:
            # e.g. a read-only file or directory: reads may still work
            logger.warning(
                "router: cannot write the embedding cache %s (%s); continuing without saving embeddings",
                self.path,
                e,
            )
            self._writable = False
        except (sqlite3.Error, OSError) as e:
            self._disable(e)
