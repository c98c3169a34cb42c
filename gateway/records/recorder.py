"""The outermost layer of the call chain: every proxied call becomes an execution record.

Being outermost, it sees the final result or error (after plugins translated it),
every attempt the retry layer made, and the whole latency. It only captures: the
record goes to the writer's buffer, and redaction and summaries happen on the
writer's thread. The execution id it makes is the result's feedback token; it leaves
it in `call.notes` for the server, which puts it in the result's `_meta`.

A call an admission layer refused (`REFUSED_NOTE`: hidden or unknown tool, limits, a server
that is down, a tool the client cannot run) never reached a server: it is recorded as refused,
with a summary of its arguments and nothing for the router to learn from (`refused`).

It keeps the start time of every call under way (`started`, `oldest()`) until the call's
record is in the writer's buffer, so `Records.signal_horizon` knows how late a record can
still land.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import mcp_types as types

from gateway.calls.chain import REFUSED_NOTE, CallHandler, ToolCall
from gateway.observability.tracing import current_trace_id
from gateway.records.model import EXECUTION_ID_NOTE, PARENT_NOTE, PendingExecution
from gateway.records.trail import SearchTrail

__all__ = [
    "CLIENT_LABEL_NOTE",
    "CLIENT_NOTE",
    "SESSION_NOTE",
    "CallRecorder",
    "RecordRefused",
    "new_execution_id",
    "trail_keys",
]

SESSION_NOTE = "session_id"
CLIENT_NOTE = "client_id"
"""`ToolCall.notes` keys the server sets: who is calling (see `GatewayServer`)."""
CLIENT_LABEL_NOTE = "client_label"
"""The note the record's client shows when `CLIENT_NOTE` is None: the MCP client's `name/version`."""

RecordRefused = Callable[[ToolCall, BaseException, str], None]
"""Records a refused call under the given execution id (`Records.record_refused`)."""


class _RandomIds:
    """Random (version 4) UUIDs as 32 hex digits, as `uuid.uuid4().hex` makes them, from the system's random
    source read 4 KiB at a time and made into ids 256 at a time: an execution id is its result's feedback
    token, so unguessable, and one system call and one `UUID` object a call cost more than the rest of
    making its record."""

    _BLOCK = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: list[str] = []

    def __call__(self) -> str:
        with self._lock:
            ids = self._ids
            if not ids:
                ids = self._ids = self._made()
            return ids.pop()

    def _made(self) -> list[str]:
        raw = bytearray(os.urandom(self._BLOCK))
        raw[6::16] = bytes(byte & 0x0F | 0x40 for byte in raw[6::16])  # version 4
        raw[8::16] = bytes(byte & 0x3F | 0x80 for byte in raw[8::16])  # the RFC 4122 variant
        hexed = raw.hex()
        return [hexed[at : at + 32] for at in range(0, len(hexed), 32)]

    def forget(self) -> None:
        """In a forked child: never hand out what the parent may hand out too."""
        self._ids = []


new_execution_id = _RandomIds()
"""A new execution id (`uuid.uuid4().hex`'s format)."""
os.register_at_fork(after_in_child=new_execution_id.forget)


def trail_keys(session_id: str | None, client_id: str | None) -> list[str]:
    """The keys a session's searches are remembered under: the session first, then the caller."""
    keys = []
    if session_id is not None:
        keys.append("s:" + session_id)
    if client_id is not None:
        keys.append("c:" + client_id)
    return keys


class CallRecorder:
    """The recording middleware; `submit` is the writer's (never blocks, never raises)."""

    def __init__(self, submit: Callable[[PendingExecution], None], trail: SearchTrail, refused: RecordRefused) -> None:
        self.submit = submit
        self.trail = trail
        self.refused = refused
        self.started: dict[str, float] = {}
        """Execution id -> start time (`at`) of the calls under way: not yet handed to `submit`."""

    def oldest(self) -> float | None:
        """The start time of the longest call under way, None when none is (see `Records.signal_horizon`)."""
        return min(self.started.values(), default=None)

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        notes = call.notes
        execution_id = notes[EXECUTION_ID_NOTE] = new_execution_id()
        session_id, client_id = notes.get(SESSION_NOTE), notes.get(CLIENT_NOTE)
        attempt_errors: list[tuple[int, BaseException]] = []
        call.failures = attempt_errors  # each failed attempt, noted by `chain.send_call`
        at, started = time.time(), time.perf_counter()
        self.started[execution_id] = at
        record = PendingExecution(
            id=execution_id,
            at=at,
            server=call.server,
            tool=call.name,
            session_id=session_id,
            client_id=client_id or notes.get(CLIENT_LABEL_NOTE),
            arguments=call.arguments,
            latency_ms=0.0,
            attempts=0,
            search_id=self.trail.find(trail_keys(session_id, client_id), call.name),
            attempt_errors=attempt_errors,
            trace_id=current_trace_id(),
            parent_id=notes.get(PARENT_NOTE),
        )
        refused = False
        try:
            record.result = await call_next(call)
            return record.result
        except BaseException as error:  # recorded, then raised unchanged: errors and cancellations alike
            refused = bool(notes.get(REFUSED_NOTE))
            if refused:
                self.refused(call, error, execution_id)
            else:
                record.error = error
            raise
        finally:
            try:
                if not refused:
                    record.latency_ms = (time.perf_counter() - started) * 1000
                    record.attempts = call.attempts
                    self.submit(record)
            finally:
                del self.started[execution_id]  # after it is in the writer's buffer: never in neither
