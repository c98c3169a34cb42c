"""`Records`: the store, the writer, the call recorder and the search trail of a running gateway."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio

from gateway.records.model import PendingExecution, SearchRow
from gateway.records.recorder import CallRecorder, trail_keys
from gateway.records.redaction import Masker, Redactor, no_mask
from gateway.records.rows import execution_rows
from gateway.records.sqlite import SqliteStore
from gateway.records.store import Batch, RecordStore
from gateway.records.trail import SearchTrail
from gateway.records.writer import RecordWriter
from gateway.settings import RecordsSettings, Settings

__all__ = ["SQLITE_FILE", "Records", "open_store"]

SQLITE_FILE = "records.sqlite3"
"""The SQLite store's file name in the data directory."""


def open_store(settings: Settings) -> RecordStore:
    """The store `GATEWAY_DATABASE_URL` names (PostgreSQL), else the SQLite file in the data dir.

    Nothing is connected yet: the first write (or read) connects and migrates.
    """
    url = settings.database_url
    if not url:
        return SqliteStore(settings.data_dir / SQLITE_FILE)
    if url.startswith(("postgresql://", "postgres://")):
        from gateway.records.postgres import PostgresStore  # psycopg takes 0.15 s to import: only when used

        return PostgresStore(url)
    scheme = url.split(":", 1)[0]
    raise ValueError(
        f"GATEWAY_DATABASE_URL must be a postgresql:// URL (or unset for SQLite in the data dir); got {scheme}:..."
    )


class Records:
    """What the gateway records, wired together. Use `async with records.running():`."""

    def __init__(self, settings: RecordsSettings, store: RecordStore, mask: Masker = no_mask) -> None:
        self.settings = settings
        self.store = store
        self.mask = mask
        """Masks a server's configured secrets in stored text (`Upstream.redact`)."""
        self.redactor = Redactor(settings.redact_keys)
        self.writer = RecordWriter(
            store,
            self._batch,
            buffer_size=settings.buffer_size,
            batch_size=settings.batch_size,
            flush_interval=settings.flush_interval,
            retention_days=settings.retention_days,
        )
        self.trail = SearchTrail()
        self.recorder = CallRecorder(self.writer.submit, self.trail)
        """The call-chain middleware (`Registry.record_calls`)."""

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Records]:
        """Run the writer; on exit, flush what is buffered and close the store."""
        self.writer.start()
        try:
            yield self
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.writer.close)

    async def flush(self) -> None:
        """Write what is buffered now (so a lookup sees executions made milliseconds ago)."""
        await anyio.to_thread.run_sync(self.writer.flush)

    def record_search(
        self,
        query: str,
        tools: Sequence[str],
        latency_ms: float,
        *,
        session_id: str | None,
        client_id: str | None,
    ) -> str:
        """Queue a search record and remember it for the calls that follow; returns its id."""
        search_id = uuid.uuid4().hex
        keys = trail_keys(session_id, client_id)
        if keys:
            self.trail.add(keys, search_id, tools)
        stored_query = query if self.settings.store_queries else None
        row = SearchRow(search_id, time.time(), session_id, client_id, stored_query, tuple(tools), latency_ms)
        self.writer.submit(row)
        return search_id

    def record_refused(
        self,
        tool: str,
        server: str | None,
        arguments: dict[str, Any] | None,
        error: BaseException,
        *,
        session_id: str | None,
        client_id: str | None,
    ) -> str:
        """Queue the record of a call refused before it reached a server (unknown or hidden tool,
        limits); returns its id. It never reached the server, so it teaches the router nothing."""
        record = PendingExecution(
            id=uuid.uuid4().hex,
            at=time.time(),
            server=server or "",
            tool=tool,
            session_id=session_id,
            client_id=client_id,
            arguments=arguments,
            latency_ms=0.0,
            attempts=0,
            search_id=None,
            error=error,
        )
        self.writer.submit(record)
        return record.id

    def _batch(self, records: Sequence[Any]) -> Batch:
        """Turn buffered records into rows (the writer's thread)."""
        batch = Batch()
        for record in records:
            if isinstance(record, PendingExecution):
                values, failures = execution_rows(record, self.redactor, partial(self.mask, record.server))
                batch.executions.append(values)
                batch.failures.extend(failures)
            else:
                batch.searches.append(record)
        return batch
