"""The PostgreSQL records store, for deployments where several gateway replicas share records.

psycopg 3 is a core dependency of the gateway already (the sql plugin uses it), so a
`postgresql://` URL needs nothing more installed. The password may be in the URL or
in libpq's usual places (`PGPASSWORD`, `~/.pgpass`); it never appears in messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from gateway.records.store import SqlStore
from gateway.urls import redact_url

__all__ = ["PostgresStore"]

CONNECT_TIMEOUT = 5
"""Seconds a connection attempt may take: a store that is down must not hold the writer long."""
_MIGRATION_LOCK = 0x6D637067  # any constant shared by every replica: "mcpg"


class PostgresStore(SqlStore):
    placeholder = "%s"
    errors = (psycopg.Error, OSError)

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url
        self.description = f"records store {redact_url(url)}"

    def _open(self) -> Any:
        return psycopg.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT)

    @contextmanager
    def _transaction(self, connection: Any) -> Iterator[None]:
        with connection.transaction():
            yield

    def _lock_schema(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))

    def _is_unique_violation(self, error: BaseException) -> bool:
        return isinstance(error, pg_errors.UniqueViolation)
