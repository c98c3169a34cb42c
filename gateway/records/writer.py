"""The records writer: a bounded buffer that a background thread flushes in batches.

A call only appends to the buffer (under a lock, no I/O). The thread writes a batch
every `flush_interval` seconds, or as soon as `batch_size` records or half of
`buffer_bytes` wait, in one transaction. The buffer is bounded twice: in records (`buffer_size`) and in bytes
(`buffer_bytes`, each record weighed by its submitter, roughly what it holds). When
either is full, or the store fails, records are dropped: the count is
`RecordWriter.dropped`, and a warning says so at most once a minute. A batch the store refuses
is written again one record at a time, so one record that cannot be stored costs no other: it
is stored as its summary with the reason (`to_summary`, counted in `RecordWriter.summarized`), or
dropped when even that fails, and the records after it are still written unless the store itself
is failing (a summary refused too). The buffer counts
the batch being written too, so a process killed at any moment loses at most
`buffer_size` records, at most `flush_interval` seconds old (plus a flush's own duration).
Records older than `retention_days` are deleted hourly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from itertools import chain
from typing import Any

from gateway.records.store import Batch, RecordsError, RecordStore

__all__ = ["RETENTION_EVERY", "RecordWriter"]

logger = logging.getLogger(__name__)

RETENTION_EVERY = 3600.0
"""Seconds between deletions of records past their retention."""
DROP_LOG_EVERY = 60.0
"""Seconds between two warnings about dropped records."""

ToBatch = Callable[[Sequence[Any]], Batch]
ToSummary = Callable[[Any, str], Batch]
"""One record as the least that can be kept of it, with why the whole could not be stored."""


class RecordWriter:
    """Buffers records and writes them from its own thread. `start()`, `submit()`..., `close()`."""

    def __init__(
        self,
        store: RecordStore,
        to_batch: ToBatch,
        to_summary: ToSummary,
        *,
        buffer_size: int,
        buffer_bytes: int,
        batch_size: int,
        flush_interval: float,
        retention_days: float,
    ) -> None:
        self.store = store
        self.to_batch = to_batch
        self.to_summary = to_summary
        self.buffer_size, self.buffer_bytes, self.batch_size = buffer_size, buffer_bytes, batch_size
        self.flush_interval, self.retention_days = flush_interval, retention_days
        self.dropped = 0
        """Records lost so far: buffer full, or the store failed to take them."""
        self.written = 0
        self.summarized = 0
        """Records the store refused as they were, stored as their summary with the reason instead."""
        self._buffer: list[Any] = []
        self._taken: list[Any] = []
        """The records of the flush under way (written or not yet)."""
        self._sizes: list[int] = []
        self._in_flight = 0
        self._bytes = 0
        """Bytes of the records buffered or being written."""
        self._wake = threading.Condition()
        self._flushing = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._last_drop_log = -DROP_LOG_EVERY
        self._last_summary_log = -DROP_LOG_EVERY
        self._dropped_unlogged = 0
        self._next_retention = 0.0

    @property
    def pending(self) -> int:
        """Records not yet written: waiting in the buffer, or in the batch being written."""
        with self._wake:
            return len(self._buffer) + self._in_flight

    # ---- the call path ----------------------------------------------------------------

    @property
    def pending_bytes(self) -> int:
        """Bytes of the records not yet written, as their submitters weighed them."""
        with self._wake:
            return self._bytes

    def submit(self, record: Any, size: int = 0) -> None:
        """Queue one record that holds about `size` bytes; never blocks on I/O, never raises. A buffer full
        in records or in bytes drops it (counted)."""
        with self._wake:
            if len(self._buffer) + self._in_flight >= self.buffer_size:
                full = "the buffer is full (records.buffer_size)"
            elif self._bytes + size > self.buffer_bytes:
                full = "the buffer is full (records.buffer_bytes)"
            else:
                full = ""
                self._buffer.append(record)
                self._sizes.append(size)
                self._bytes += size
                if self._due():
                    self._wake.notify()
            if full:
                self.dropped += 1
        if full:
            self._note_drops(1, full)

    def oldest(self, time_of: Callable[[Any], float | None]) -> float | None:
        """The earliest `time_of` among the records not yet written (buffered, or in the flush under way),
        None when there are none: no record of an earlier time can still land in the store (the router
        reads its signals since then, `Records.signal_horizon`). O(records held); for a periodic reader."""
        with self._wake:
            times = [t for record in chain(self._taken, self._buffer) if (t := time_of(record)) is not None]
        return min(times, default=None)

    # ---- the thread -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="records-writer", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 30.0) -> None:
        """Stop the thread after a last flush of everything buffered (a clean shutdown loses nothing)."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self.flush()
        self.store.close()

    def _run(self) -> None:
        next_flush = time.monotonic() + self.flush_interval
        while True:
            with self._wake:
                while not self._stopping and not self._due():
                    left = next_flush - time.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                stopping = self._stopping
            if stopping:
                return
            next_flush = time.monotonic() + self.flush_interval
            self.flush()
            self._apply_retention()

    def _due(self) -> bool:
        """A batch is due before its time: `batch_size` records, or half of `buffer_bytes`, wait (under `_wake`)."""
        return len(self._buffer) >= self.batch_size or self._bytes >= self.buffer_bytes // 2

    def flush(self) -> None:
        """Write everything buffered now, in batches; from any thread (feedback flushes before a lookup)."""
        with self._flushing:
            with self._wake:
                taken, self._buffer = self._buffer, []
                sizes, self._sizes = self._sizes, []
                self._taken = taken
                self._in_flight = len(taken)
            try:
                for start in range(0, len(taken), self.batch_size):
                    chunk = taken[start : start + self.batch_size]
                    try:
                        self.store.write(self.to_batch(chunk))
                    except Exception as error:  # noqa: BLE001 - boundary: one bad record must not cost the batch
                        logger.debug("records: a batch was refused; writing its records one by one", exc_info=True)
                        if not self._write_one_by_one(chunk):
                            self.lost(len(taken) - start - len(chunk), f"the store failed: {_reason(error)}")
                            return
                    else:
                        self.written += len(chunk)
                    finally:
                        with self._wake:
                            self._in_flight -= len(chunk)
                            self._bytes -= sum(sizes[start : start + self.batch_size])
            finally:
                with self._wake:
                    self._in_flight = 0
                    self._taken = []
                    self._bytes = sum(self._sizes)

    def _write_one_by_one(self, chunk: Sequence[Any]) -> bool:
        """Write a refused batch's records one at a time: a record the store refuses goes as its summary
        with the reason. False when a summary is refused too (the store itself fails): the record and the
        rest of the chunk are counted lost, and the caller stops."""
        for index, record in enumerate(chunk):
            try:
                self.store.write(self.to_batch([record]))
            except Exception as error:  # noqa: BLE001 - boundary: this record is bad; keep what can be kept of it
                reason = _reason(error)
                try:
                    self.store.write(self.to_summary(record, reason))
                except Exception as summary_error:  # boundary: the store itself refuses; count, never raise
                    if not isinstance(summary_error, RecordsError):
                        logger.exception("records: could not write a record's summary")
                    self.lost(len(chunk) - index, f"the store failed: {_reason(summary_error)}")
                    return False
                with self._wake:
                    self.summarized += 1
                    quiet = time.monotonic() - self._last_summary_log < DROP_LOG_EVERY
                    if not quiet:
                        self._last_summary_log = time.monotonic()
                if not quiet:
                    logger.warning(
                        "records: a record could not be stored as it was; its summary was (%d so far): %s",
                        self.summarized,
                        reason,
                    )
            else:
                self.written += 1
        return True

    def lost(self, count: int, reason: str) -> None:
        """Count records lost: the store failed, or they could not be made."""
        with self._wake:
            self.dropped += count
        self._note_drops(count, reason)

    def _note_drops(self, count: int, reason: str) -> None:
        """A warning at most once a minute, with how many were dropped since the last one."""
        now = time.monotonic()
        with self._wake:
            self._dropped_unlogged += count
            if now - self._last_drop_log < DROP_LOG_EVERY:
                return
            self._last_drop_log, unlogged, self._dropped_unlogged = now, self._dropped_unlogged, 0
            total = self.dropped
        logger.warning("records: dropped %d record(s): %s (%d dropped since start)", unlogged, reason, total)

    def _apply_retention(self) -> None:
        now = time.time()
        if now < self._next_retention:
            return
        self._next_retention = now + RETENTION_EVERY
        try:
            deleted = self.store.delete_before(now - self.retention_days * 86400)
        except RecordsError as error:
            logger.warning("records: could not delete old records: %s", error)
            self._next_retention = now + 60  # try again soon
            return
        if deleted:
            logger.info("records: deleted %d execution(s) older than %g days", deleted, self.retention_days)


def _reason(error: BaseException) -> str:
    """An error as one short line, for a summary row and a log line."""
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:300]
