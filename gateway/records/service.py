"""`Records`: the store, the writer, the call recorder and the search trail of a running gateway."""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
import mcp_types as types

from gateway.calls.chain import ToolCall
from gateway.config.runtime_settings import RecordsSettings
from gateway.config.settings import Settings
from gateway.errors import GatewayError
from gateway.observability.tracing import current_trace_id
from gateway.records.cut import refused_summary, size_estimate, storable
from gateway.records.model import PARENT_NOTE, FailureRow, PendingExecution, SearchRow
from gateway.records.recorder import CLIENT_LABEL_NOTE, CLIENT_NOTE, SESSION_NOTE, CallRecorder, trail_keys
from gateway.records.redaction import Masker, Redactor, no_mask
from gateway.records.rows import ExecutionValues, StoredLimits, digest, execution_rows, outcome, storable_values
from gateway.records.sqlite import SqliteStore
from gateway.records.store import Batch, RecordStore
from gateway.records.trail import SearchTrail
from gateway.records.writer import RecordWriter
from gateway.router.signals import UsageSignal
from gateway.sizes import cut_bytes

__all__ = ["FEEDBACK_MARGIN", "SQLITE_FILE", "Records", "open_store"]

logger = logging.getLogger(__name__)

SQLITE_FILE = "records.sqlite3"
"""The SQLite store's file name in the data directory."""
RECORD_BYTES = 512
"""What a record weighs in the writer's buffer besides its texts: ids, numbers, the object itself."""
HEAVY_SHARE = 8
"""A call's record that weighs more than `buffer_bytes / HEAVY_SHARE` (1 MiB by default: its arguments or
result are large) is turned into its cut rows at once, on the call path, so the buffer holds kilobytes for
it, not megabytes; lighter ones are turned into rows on the writer's thread, off the call path."""

FEEDBACK_MARGIN = 10.0
"""Seconds: a feedback row is written straight away (`feedback.py`), within this of its time."""

ExecutionRows = tuple[ExecutionValues, list[FailureRow]]


def open_store(settings: Settings) -> RecordStore:
    """The store `GATEWAY_DATABASE_URL` names (PostgreSQL), else the SQLite file in the data dir.

    Nothing is connected yet: the first write (or read) connects and migrates.
    """
    url = settings.database_url
    store: SqliteStore | None = None
    if not url:
        store = SqliteStore(settings.data_dir / SQLITE_FILE)
        store.replica = settings.replica_id
        return store
    if url.startswith(("postgresql://", "postgres://")):
        from gateway.records.postgres import PostgresStore  # psycopg takes 0.15 s to import: only when used

        shared = PostgresStore(url)
        shared.replica = settings.replica_id
        return shared
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
        self.limits = StoredLimits(settings.max_argument_bytes, settings.max_result_bytes)
        self._heavy = settings.buffer_bytes // HEAVY_SHARE
        self.writer = RecordWriter(
            store,
            self._batch,
            self._summary,
            buffer_size=settings.buffer_size,
            buffer_bytes=settings.buffer_bytes,
            batch_size=settings.batch_size,
            flush_interval=settings.flush_interval,
            retention_days=settings.retention_days,
        )
        self.trail = SearchTrail()
        self.recorder = CallRecorder(self.submit_execution, self.trail, self.record_refused)
        """The call-chain middleware (`Registry.record_calls`)."""
        self.ask_peers_to_flush: Callable[[], None] | None = None
        """Asks the other replicas to write what they hold now (synchronous, never raises; set when replicas
        share the store): feedback may reach this replica before the one that made the call has written it."""

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Records]:
        """Run the writer; on exit, flush what is buffered and close the store."""
        self.writer.start()
        try:
            yield self
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(self.writer.close)

    async def usage_signals(self, since: float | None = None) -> Sequence[UsageSignal]:
        """The router's signals (`gateway.router.signals.SignalSource`), read from the store."""
        return await self.store.usage_signals(since)

    def signal_horizon(self) -> float:
        """A time before which no signal can still land in the store: the start of the longest call under
        way, the earliest record not yet written, and now less `FEEDBACK_MARGIN`, whichever is first.

        The router reads signals since then, not since a fixed two minutes ago: at 200 calls a second the
        fixed overlap re-read 30,000 rows every 30 s, which stalled calls and ratcheted the memory up."""
        times = [time.time() - FEEDBACK_MARGIN, self.recorder.oldest(), self.writer.oldest(_time_of)]
        return min(t for t in times if t is not None)

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
        stored_query = cut_bytes(query, self.settings.max_argument_bytes) if self.settings.store_queries else None
        row = SearchRow(search_id, time.time(), session_id, client_id, stored_query, tuple(tools), latency_ms)
        weight = RECORD_BYTES + len(stored_query or "") + sum(len(tool) for tool in tools)
        self.writer.submit(row, weight)
        return search_id

    def record_refused(self, call: ToolCall, error: BaseException, execution_id: str) -> None:
        """Queue the record of a call an admission layer refused before it reached a server (unknown
        or hidden tool, limits, a server that is down; `CallRecorder` calls it). It never reached the
        server, so it teaches the router nothing, and only a summary of its arguments is kept: their
        names and size, none of their values."""
        record = PendingExecution(
            id=execution_id,
            at=time.time(),
            server=call.server,
            tool=call.name,
            session_id=call.notes.get(SESSION_NOTE),
            client_id=call.notes.get(CLIENT_NOTE) or call.notes.get(CLIENT_LABEL_NOTE),
            arguments=None,
            latency_ms=0.0,
            attempts=0,
            search_id=None,
            error=error,
            stored_arguments=refused_summary(call.arguments, partial(self.mask, call.server)),
            trace_id=current_trace_id(),
            parent_id=call.notes.get(PARENT_NOTE),
        )
        self.submit_execution(record)

    def record_run(
        self,
        execution_id: str,
        at: float,
        program: str,
        result: types.CallToolResult,
        latency_ms: float,
        *,
        session_id: str | None,
        client_id: str | None,
    ) -> None:
        """Queue the record of a code-mode program's run (server `gateway`, tool `execute`, the program
        as its `code` argument); its inner calls' records name `execution_id` as their parent."""
        record = PendingExecution(
            id=execution_id,
            at=at,
            server="gateway",
            tool="execute",
            session_id=session_id,
            client_id=client_id,
            arguments={"code": program},
            latency_ms=latency_ms,
            attempts=1,
            search_id=None,
            result=result,
            trace_id=current_trace_id(),
        )
        self.submit_execution(record)

    def submit_execution(self, record: PendingExecution) -> None:
        """Hand a call's record to the writer, weighed; one too heavy to hold as it is goes as its rows
        (cut), made now. Never raises: the recorder calls it as the call returns."""
        weight = _weight(record, self._heavy)
        if weight <= self._heavy:
            self.writer.submit(self._held(record), weight)
            return
        try:
            rows = self._rows(record)
        except Exception:  # boundary: a bug in turning a record into rows must not fail the call
            logger.exception("records: could not make the rows of a call")
            self.writer.lost(1, "a record could not be made")
            return
        values, failures = rows
        texts = [v for v in values if isinstance(v, str)] + [f.details for f in failures]
        self.writer.submit(rows, RECORD_BYTES * (1 + len(failures)) + sum(len(text) for text in texts))

    def _held(self, record: PendingExecution) -> PendingExecution:
        """`record` as the writer's buffer holds it: its result as a digest (`rows.ResultDigest`), no empty list
        of failed attempts; what the garbage collector walks until the flush is then a few objects, not dozens.
        A record that cannot be digested (a bug) is held as it is: the writer's thread turns it into rows anyway."""
        if not record.attempt_errors:
            record.attempt_errors = ()
        if record.result is not None:
            try:
                record.digest = digest(record.result, self.limits.result_bytes)
            except Exception:  # boundary: never fail the call; the rows are made from the result instead
                logger.exception("records: could not digest a call's result")
                return record
            record.result = None
        return record

    def _rows(self, record: PendingExecution) -> ExecutionRows:
        return execution_rows(record, self.redactor, partial(self.mask, record.server), self.limits)

    def _batch(self, records: Sequence[Any]) -> Batch:
        """Turn buffered records into rows (the writer's thread)."""
        batch = Batch()
        for record in records:
            if isinstance(record, SearchRow):
                batch.searches.append(_storable_search(record))
                continue
            values, failures = self._rows(record) if isinstance(record, PendingExecution) else record
            batch.executions.append(values)
            batch.failures.extend(failures)
        return batch

    def _summary(self, record: Any, reason: str) -> Batch:
        """What is kept of a record the store refused (the writer's thread): a call's row without its
        arguments, result summary and failures, the reason in their place; a search without its query."""
        note = storable(f"[not stored: {reason}]")
        if isinstance(record, SearchRow):
            return Batch(searches=[dataclasses.replace(_storable_search(record), query=note, results=())])
        if isinstance(record, PendingExecution):
            values = _summary_values(record)
        else:
            values, _ = record
        kept = list(storable_values(values))
        kept[_ARGUMENTS], kept[_SUMMARY], kept[_SIZE] = None, note, None
        return Batch(executions=[tuple(kept)])


_ARGUMENTS, _SUMMARY, _SIZE = 6, 7, 8
"""Positions in `store.EXECUTION_COLUMNS`: arguments, response_summary, response_size."""


def _summary_values(record: PendingExecution) -> ExecutionValues:
    """A call's row from its plain fields alone (nothing of its arguments, result or errors)."""
    status, code = outcome(record)
    return (
        record.id,
        record.at,
        record.server,
        record.tool,
        record.session_id,
        record.client_id,
        None,
        None,
        None,
        round(record.latency_ms, 3),
        status,
        code,
        record.attempts,
        record.search_id,
        record.trace_id,
        record.parent_id,
    )


def _storable_search(row: SearchRow) -> SearchRow:
    """A search row with its texts storable (`cut.storable`)."""
    query = storable(row.query) if row.query is not None else None
    return dataclasses.replace(row, query=query, results=tuple(storable(tool) for tool in row.results))


def _time_of(record: Any) -> float | None:
    """When a buffered record happened: a call's (as it is, or as its rows) or a search's."""
    if isinstance(record, PendingExecution | SearchRow):
        return record.at
    values, _ = record
    return float(values[1])  # `store.EXECUTION_COLUMNS`: id, at, ...


def _weight(record: PendingExecution, cap: int) -> int:
    """Roughly the bytes a call's record holds (its arguments, result or error), counted no further than
    just past `cap`: cheap enough for the call path, whatever the size of the call."""
    total = RECORD_BYTES
    if record.stored_arguments is not None:
        total += len(record.stored_arguments)
    total += size_estimate(record.arguments, cap)
    if record.result is not None:
        for block in record.result.content:
            if total > cap:
                return total
            total += RECORD_BYTES + _payload_bytes(block)
        total += size_estimate(record.result.structured_content, cap)
    errors = [error for _, error in record.attempt_errors] + ([record.error] if record.error is not None else [])
    return total + sum(len(error.message) if isinstance(error, GatewayError) else RECORD_BYTES for error in errors)


def _payload_bytes(block: types.ContentBlock) -> int:
    """The size of a content block's text or data (base64), or its embedded resource's."""
    inner: Any = block.resource if isinstance(block, types.EmbeddedResource) else block
    payload = getattr(inner, "text", None) or getattr(inner, "data", None) or getattr(inner, "blob", None)
    return len(payload) if isinstance(payload, str | bytes) else 0
