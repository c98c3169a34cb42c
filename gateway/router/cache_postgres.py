"""The embedding cache in PostgreSQL, shared by every gateway replica that points at the database.

Same contract as `SqliteEmbeddingCache`: keys are `cache_key(model_id, document)`, vectors
are little-endian float32 bytes (a `bytea`) and come back bit-for-bit. With several
replicas, the first one to start embeds the catalog and the others read its vectors.

The table (`embedding_cache`) is created if missing, under an advisory lock so that
replicas starting together do not race. Like the SQLite cache it is an optimization,
never a reason for routing to fail: a database that cannot be reached, or that breaks
later, is logged once as a warning and the router goes on without the cache.

Each call opens its own short connection: the cache is read at start-up and when tools
change, so holding a connection per replica the rest of the time would only use up the
server's connection slots.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import psycopg

from gateway.router.base import Vector
from gateway.router.cache_rows import vector_of, vector_rows
from gateway.urls import redact_url

__all__ = ["PostgresEmbeddingCache", "TABLE"]

logger = logging.getLogger(__name__)

TABLE = "embedding_cache"
_SCHEMA_LOCK = 0x6D67_7765_6D62  # "mgwemb": serializes CREATE TABLE among replicas starting together
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    key TEXT PRIMARY KEY,
    dim INTEGER NOT NULL,
    vector BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
)
"""


class PostgresEmbeddingCache:
    """An `EmbeddingCache` in the PostgreSQL database at `url` (`postgresql://user:pass@host:port/db`)."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.url = url
        self._connect_timeout = max(1, round(connect_timeout))
        self._usable = True
        try:
            with self._connect() as connection, connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                connection.execute(_SCHEMA)
        except (psycopg.Error, OSError) as error:
            self._disable(error)

    @property
    def usable(self) -> bool:
        """False once the database turned out unreachable or broken: every call is then a no-op (all misses)."""
        return self._usable

    @contextlib.contextmanager
    def _connect(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.url, connect_timeout=self._connect_timeout, application_name="mcp-gateway") as c:
            yield c

    def _disable(self, error: BaseException) -> None:
        if self._usable:
            detail = str(error).strip().splitlines()[0] if str(error).strip() else ""
            logger.warning(
                "router: the PostgreSQL embedding cache at %s is unusable (%s: %s); continuing without it, "
                "tools are embedded by this replica itself",
                redact_url(self.url),
                type(error).__name__,
                redact_url(detail),
            )
        self._usable = False

    def get_many(self, keys: Sequence[str]) -> dict[str, Vector]:
        found: dict[str, Vector] = {}
        if not self._usable or not keys:
            return found
        try:
            with self._connect() as connection:
                rows = connection.execute(
                    f"SELECT key, dim, vector FROM {TABLE} WHERE key = ANY(%s)", (list(dict.fromkeys(keys)),)
                ).fetchall()
        except (psycopg.Error, OSError) as error:
            self._disable(error)
            return {}
        for key, dim, blob in rows:
            vector = vector_of(dim, blob)
            if vector is not None:
                found[key] = vector
        return found

    def put_many(self, items: Mapping[str, Vector]) -> None:
        if not self._usable or not items:
            return
        rows = vector_rows(items)
        try:
            with self._connect() as connection, connection.cursor() as cursor:
                # Another replica may have stored the same document meanwhile: its vector is the same.
                cursor.executemany(
                    f"INSERT INTO {TABLE} (key, dim, vector) VALUES (%s, %s, %s) ON CONFLICT (key) DO NOTHING", rows
                )
        except (psycopg.Error, OSError) as error:
            self._disable(error)
