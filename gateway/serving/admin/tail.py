"""The console's live tail: completed calls as they happen, over server-sent events.

`CallTail` is a bounded in-process publish/subscribe fed by the records' call recorder (`attach`):
a call's record, as it is handed to the writer, is also published here as a small event. Publishing
never blocks the call: each subscriber has a bounded buffer, and a subscriber too slow to keep up
loses events (counted, and told in its stream) instead of slowing calls down. The last `HISTORY`
events are kept, so a page opened now shows the recent calls at once, and a browser that reconnects
(`Last-Event-ID`) gets what it missed while they are still kept.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from starlette.requests import Request
from starlette.responses import StreamingResponse

from gateway.calls.chain import ToolCall
from gateway.errors import GatewayError
from gateway.records.model import PendingExecution
from gateway.records.rows import outcome
from gateway.records.service import Records

__all__ = ["HISTORY", "SUBSCRIBER_BUFFER", "CallTail", "TailEvent", "TailFilter", "event_stream", "tail_endpoint"]

HISTORY = 500
"""Events kept for a page that opens or reconnects."""
SUBSCRIBER_BUFFER = 2000
"""Events one subscriber may have waiting (10 s at 200 calls/s) before it starts losing them."""
KEEPALIVE_SECONDS = 15.0
"""A comment line this often keeps proxies and the browser from closing an idle stream."""
BATCH = 500
"""Events already waiting are sent together, in one write, up to this many."""
STREAM_SECONDS = 300.0
"""One response streams this long at most, then ends: the browser reconnects with `Last-Event-ID`,
and a gateway shutting down is never held up long by an open page."""


@dataclass(slots=True)
class TailEvent:
    """One completed call, as the tail shows it: no arguments and no result (the call's page has them).
    Not frozen: one is made for every call, viewer or not (the history), and a frozen dataclass's
    `__init__` sets each field through `object.__setattr__`."""

    seq: int
    id: str
    at: float
    server: str
    tool: str
    status: str
    """ok, error, timeout or refused, as the call log names them (`gateway.records.queries`)."""
    code: str | None
    latency_ms: float
    client: str | None

    def json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


@dataclass(frozen=True)
class TailFilter:
    """The tail's filters, from the page's query string: blank ones match everything."""

    server: str = ""
    tool: str = ""
    status: str = ""

    def matches(self, event: TailEvent) -> bool:
        return (
            (not self.server or event.server == self.server)
            and (not self.tool or self.tool in event.tool)
            and (
                not self.status or event.status == self.status or (self.status == "error" and event.status == "timeout")
            )
        )


class CallTail:
    """Completed calls, published to every open tail; see the module's docstring."""

    def __init__(self, *, history: int = HISTORY, buffer: int = SUBSCRIBER_BUFFER) -> None:
        self.recent: deque[TailEvent] = deque(maxlen=history)
        self.buffer = buffer
        self.dropped = 0
        """Events lost by slow subscribers, all told."""
        self._seq = 0
        self._subscribers: dict[MemoryObjectSendStream[TailEvent], None] = {}
        self.closed = False
        """Set when the gateway stops serving HTTP: every stream ends, so no open page holds up shutdown."""

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def attach(self, records: Records) -> None:
        """Be told of every call the records' recorder sees: its records, and the calls it records as refused.

        The recorder's two callables are wrapped, so what it hands the writer is unchanged; both run on
        the event loop, as `publish` must."""
        recorder = records.recorder
        submit, refused = recorder.submit, recorder.refused

        def submit_and_publish(record: PendingExecution) -> None:
            submit(record)
            stored, code = outcome(record)
            status = "ok" if stored == "success" else stored
            self.publish(
                record.id, record.at, record.server, record.tool, status, code, record.latency_ms, record.client_id
            )

        def refused_and_publish(call: ToolCall, error: BaseException, execution_id: str) -> None:
            refused(call, error, execution_id)
            code = error.code if isinstance(error, GatewayError) else None
            client = call.notes.get("client_id")
            self.publish(execution_id, time.time(), call.server, call.name, "refused", code, 0.0, client)

        recorder.submit = submit_and_publish
        recorder.refused = refused_and_publish

    def publish(
        self,
        execution_id: str,
        at: float,
        server: str,
        tool: str,
        status: str,
        code: str | None,
        latency_ms: float,
        client: str | None,
    ) -> None:
        """Hand one call to every subscriber without waiting; a full subscriber loses it. Never raises."""
        self._seq += 1
        latency = round(latency_ms, 2) if math.isfinite(latency_ms) else 0.0
        event = TailEvent(self._seq, execution_id, at, server, tool, status, code, latency, client)
        self.recent.append(event)
        for stream in list(self._subscribers):
            try:
                stream.send_nowait(event)
            except anyio.WouldBlock:
                self.dropped += 1
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                self._subscribers.pop(stream, None)

    def close(self) -> None:
        """End every open stream now, and any opened later (the gateway is stopping)."""
        self.closed = True
        for stream in list(self._subscribers):
            stream.close()
        self._subscribers.clear()

    def since(self, seq: int) -> list[TailEvent]:
        """The kept events after `seq` (all of them for 0)."""
        return [event for event in self.recent if event.seq > seq]

    @contextmanager
    def subscribe(self) -> Iterator[MemoryObjectReceiveStream[TailEvent]]:
        """A stream of the calls published from now on, until the block ends."""
        send, receive = anyio.create_memory_object_stream[TailEvent](self.buffer)
        if self.closed:
            send.close()
        else:
            self._subscribers[send] = None
        try:
            yield receive
        finally:
            self._subscribers.pop(send, None)
            send.close()
            receive.close()


def _last_event_id(request: Request) -> int:
    text = request.headers.get("last-event-id") or request.query_params.get("after") or "0"
    return int(text) if text.isdigit() else 0


def _message(event: TailEvent) -> str:
    return f"id: {event.seq}\ndata: {event.json()}\n\n"


def _waiting(receive: MemoryObjectReceiveStream[TailEvent], first: TailEvent) -> list[TailEvent]:
    """`first` and the events already waiting behind it (at most `BATCH`): one write for a burst."""
    events = [first]
    while len(events) < BATCH:
        try:
            events.append(receive.receive_nowait())
        except anyio.WouldBlock:
            break
    return events


async def event_stream(
    tail: CallTail, wanted: TailFilter, after: int, clock: Callable[[], float]
) -> AsyncIterator[str]:
    """The tail as server-sent events: the kept calls after `after`, then each new one that `wanted`
    matches (a burst in one chunk), a keep-alive comment when idle; ends after `STREAM_SECONDS` or
    when the tail is closed."""
    yield "retry: 1000\n\n"
    with tail.subscribe() as receive:
        lost = tail.dropped
        last = after
        backlog = [e for e in tail.since(after) if wanted.matches(e)]
        if backlog:
            last = backlog[-1].seq
            yield "".join(_message(event) for event in backlog)
        ends = clock() + STREAM_SECONDS
        while clock() < ends:
            with anyio.move_on_after(KEEPALIVE_SECONDS) as waited:
                try:
                    first = await receive.receive()
                except anyio.EndOfStream:  # the tail was closed: the gateway is stopping
                    return
            if waited.cancelled_caught:
                yield ": keepalive\n\n"
                continue
            fresh = [e for e in _waiting(receive, first) if e.seq > last and wanted.matches(e)]
            if not fresh:
                continue
            last = fresh[-1].seq
            chunk = "".join(_message(event) for event in fresh)
            if tail.dropped != lost:
                lost = tail.dropped
                chunk += f"event: dropped\ndata: {lost}\n\n"
            yield chunk


async def tail_endpoint(tail: CallTail, request: Request) -> StreamingResponse:
    """`GET /admin/calls/stream?server=&tool=&status=`: the live tail as `text/event-stream`."""
    query = request.query_params
    wanted = TailFilter(query.get("server", ""), query.get("tool", ""), query.get("status", ""))
    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    return StreamingResponse(
        event_stream(tail, wanted, _last_event_id(request), anyio.current_time),
        media_type="text/event-stream",
        headers=headers,
    )
