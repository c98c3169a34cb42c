"""One message from an upstream is bounded while it is read, not after (issue 33).

A tool result is cut to `security.limits.max_result_bytes` once received, but receiving it
whole (a 200 MB answer buffered, parsed and validated on the event loop) is what stalls every
other caller and raises the gateway's memory. So the transports stop reading one message at
`upstreams.max_message_bytes`: the rest of the message is dropped unread (HTTP: the connection
is closed; stdio and SSE streams: skipped to the next message boundary, so the stream stays
usable), and the request it answered gets a JSON-RPC error made here, with the size and the
limit in its data. `gateway.upstreams.errors.translate_error` turns that error into a
`result_too_large` tool error naming the server, the tool, the size and the setting.

The request a dropped message answered: over HTTP the POST's own request id; on a stream (stdio,
an SSE GET) the id read from the message's first or last bytes (`message_id`): SDKs write the
id first (Python) or last (TypeScript). A message whose id cannot be read is dropped with a
warning; its request then ends at the call's timeout.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx2
import mcp_types as types
from mcp.shared.exceptions import MCPError

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MARKER",
    "SETTING",
    "BoundedStream",
    "EventBounds",
    "LineBuffer",
    "bound_responses",
    "dropped",
    "message_id",
    "refused_event",
    "too_large_error",
    "too_large_in",
    "whole_message",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SETTING = "GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES"
MARKER = "mcp-gateway/message_too_large"
"""The key, in the made-up error's data, that says the gateway dropped the answer."""
EDGE = 512
"""Bytes kept of a dropped message's start and end, to read its id from."""

_ID = rb'(-?\d+|"(?:[^"\\]|\\.)*")'
_HEAD_ID = re.compile(rb'^\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*' + _ID)
_TAIL_ID = re.compile(rb'"id"\s*:\s*' + _ID + rb'\s*(?:,\s*"jsonrpc"\s*:\s*"2\.0"\s*)?\}\s*$')
_SSE_BOUNDARIES = (b"\n\n", b"\r\n\r\n", b"\r\r")


def message_id(head: bytes, tail: bytes = b"") -> int | str | None:
    """The JSON-RPC id of a message known by its first and last bytes, or None.

    Only an id at the top level counts: first (after `"jsonrpc"`) or last in the object; a
    nested `"id"` is followed by more than one closing brace, so it never matches."""
    found = _HEAD_ID.match(head) or _TAIL_ID.search(tail)
    if found is None:
        return None
    value = json.loads(found.group(1))
    return value if isinstance(value, int | str) else None


def too_large_error(request_id: int | str, size: int, exact: bool, limit: int) -> dict[str, Any]:
    """The JSON-RPC error that stands for an answer of `size` bytes (more, unless `exact`) that was dropped."""
    said = f"{size}" if exact else f"more than {size}"
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "error": {
            "code": types.INTERNAL_ERROR,
            "message": f"The answer is {said} bytes, over the gateway's limit of {limit} ({SETTING}).",
            "data": {MARKER: {"bytes": size, "exact": exact, "limit": limit}},
        },
    }


def too_large_in(exc: MCPError) -> tuple[int, bool, int] | None:
    """(size, exact, limit) when `exc` is an error made by `too_large_error`."""
    data = exc.error.data
    found = data.get(MARKER) if isinstance(data, dict) else None
    if not isinstance(found, dict):
        return None
    try:
        return int(found["bytes"]), bool(found["exact"]), int(found["limit"])
    except (KeyError, TypeError, ValueError):
        return None


def _log_dropped(size: int, exact: bool, request_id: int | str | None, source: str, limit: int) -> None:
    logger.warning(
        "dropped a message of %s%d bytes (id %r) from %s: over %s, %d bytes",
        "" if exact else "more than ",
        size,
        request_id,
        source,
        SETTING,
        limit,
    )


def _encoded(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


class LineBuffer:
    """Splits a byte stream into lines (stdio's messages), none kept past `limit` bytes.

    `feed` returns the complete lines in a chunk and, for each line over the limit, the
    error message that replaces it (or None when its id could not be read). Pieces are
    joined once per line, so a long line costs its length, not its length squared."""

    def __init__(self, limit: int, source: str = "a server") -> None:
        self.limit = limit
        self.source = source
        self._pieces: list[bytes] = []
        self._size = 0
        self._skipping = False
        self._head = b""
        self._tail = b""

    def feed(self, chunk: bytes) -> list[bytes | dict[str, Any] | None]:
        out: list[bytes | dict[str, Any] | None] = []
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._add(piece)
            if end < 0:
                return out
            out.append(self._line())
            start = end + 1

    def _add(self, piece: bytes) -> None:
        if self._skipping:
            self._size += len(piece)
            self._tail = (self._tail + piece)[-EDGE:]
            return
        self._pieces.append(piece)
        self._size += len(piece)
        if self._size > self.limit:
            joined = b"".join(self._pieces)
            self._head, self._tail = joined[:EDGE], joined[-EDGE:]
            self._pieces = []
            self._skipping = True

    def _line(self) -> bytes | dict[str, Any] | None:
        size, skipped = self._size, self._skipping
        self._size, self._skipping = 0, False
        if not skipped:
            line = b"".join(self._pieces)
            self._pieces = []
            return line
        request_id = message_id(self._head, self._tail)
        _log_dropped(size, True, request_id, self.source, self.limit)
        return None if request_id is None else too_large_error(request_id, size, True, self.limit)


def dropped(request_id: int | str, size: int, exact: bool, limit: int, source: str) -> dict[str, Any]:
    """The error that stands for a dropped answer to `request_id` (`too_large_error`), logged."""
    _log_dropped(size, exact, request_id, source, limit)
    return too_large_error(request_id, size, exact, limit)


async def whole_message(
    next_chunk: Callable[[], Awaitable[bytes | None]], length: int | None, limit: int
) -> bytes | tuple[int, bool]:
    """A body that is one message, read whole through `next_chunk` (None at its end); or, when it
    is over `limit`, (its size, exact) as soon as that is known: at once when its Content-Length
    (`length`) says so, else when the bytes read pass it (the rest is left unread)."""
    if length is not None and length > limit:
        return length, True
    chunks: list[bytes] = []
    size = 0
    while (chunk := await next_chunk()) is not None:
        size += len(chunk)
        if size > limit:
            return size, False
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


Refuse = Callable[[bytes | bytearray, int, bool], bytes]
"""Makes the event that stands for an event over the limit, from (its start, size, exact)."""


class EventBounds:
    """Splits an SSE body into whole events, none kept past `limit` bytes.

    `feed` takes the body's next bytes and returns the events they complete (several at once
    when they are small), an event over the limit replaced by what `refuse` makes of it and the
    rest of it skipped unread up to the next event; `rest` is what is left at the body's end."""

    def __init__(self, limit: int, refuse: Refuse) -> None:
        self._limit = limit
        self._refuse = refuse
        self._pending = bytearray()
        self._skipping = False

    def feed(self, chunk: bytes) -> list[bytes]:
        pending = self._pending
        if (
            not pending
            and not self._skipping
            and len(chunk) <= self._limit
            and chunk.endswith((b"\n\n", b"\r\r", b"\r\n\r\n"))
        ):
            return [chunk]  # the common case: whole events, which end where the chunk does
        out: list[bytes] = []
        searched = max(0, len(pending) - 3)
        pending += chunk
        if self._skipping:  # the rest of a dropped event, up to its end
            first = _boundary(pending, searched, last=False)
            if first < 0:
                del pending[:-3]  # only what a boundary split across chunks needs
                return out
            del pending[:first]
            self._skipping, searched = False, 0
        end = _boundary(pending, searched, last=True)
        if end > self._limit:  # whole events, one of them maybe over the limit: each is measured
            for event in _split_events(bytes(pending[:end])):
                out.append(event if len(event) <= self._limit else self._refuse(event, len(event), True))
            del pending[:end]
        elif end >= 0:  # whole events, none of them over the limit
            out.append(bytes(pending[:end]))
            del pending[:end]
        if len(pending) > self._limit:
            out.append(self._refuse(pending, len(pending), False))
            self._skipping = True
            del pending[:-3]
        return out

    def rest(self) -> bytes | None:
        """What is left of the body at its end, an unfinished event, if any."""
        return bytes(self._pending) if self._pending and not self._skipping else None


def refused_event(
    event: bytes | bytearray, size: int, exact: bool, refusal: Callable[[int | str | None, int, bool], bytes]
) -> bytes:
    """The error event that stands for an event over the limit, answering the request it names
    (its id read from its first bytes), else the one `refusal` falls back to."""
    data = bytes(event[:EDGE]).partition(b"data:")[2].lstrip(b" ")
    request_id = message_id(data) if data else None
    return b"event: message\ndata: " + refusal(request_id, size, exact) + b"\n\n"


class BoundedStream(httpx2.AsyncByteStream):
    """A response body that never holds more than `limit` bytes of one message.

    JSON: the body is one message, passed on whole once read (the SDK reads it whole anyway),
    or replaced by the error when over the limit (refused at once when Content-Length says so).
    SSE: passed on an event at a time (`EventBounds`); an event over the limit is replaced by
    the error as an event, the rest of it skipped unread up to the next event."""

    def __init__(
        self, inner: httpx2.AsyncByteStream, limit: int, request: httpx2.Request, response_headers: Any, source: str
    ) -> None:
        self._inner = inner
        self._source = source
        self._limit = limit
        self._request = request
        self._sse = response_headers.get("content-type", "").lower().startswith("text/event-stream")
        length = response_headers.get("content-length", "")
        self._length = int(length) if length.isdigit() else None

    def _request_id(self) -> int | str | None:
        """The id of the JSON-RPC request this response answers, if it is one."""
        try:
            sent = json.loads(self._request.content)
        except (httpx2.RequestNotRead, ValueError):
            return None
        found = sent.get("id") if isinstance(sent, dict) else None
        return found if isinstance(found, int | str) else None

    def _refusal(self, size: int, exact: bool, request_id: int | str | None) -> bytes:
        if request_id is None:
            raise httpx2.SSEError(
                f"{self._source} sent a message of {'' if exact else 'more than '}{size} bytes, "
                f"over the gateway's limit of {self._limit} ({SETTING}); it answers no request the gateway can name"
            )
        return _encoded(dropped(request_id, size, exact, self._limit, self._source))

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            if self._sse:
                async for event in self._events():
                    yield event
            else:
                yield await self._whole()
        finally:
            await self._inner.aclose()

    async def _whole(self) -> bytes:
        chunks = aiter(self._inner)
        found = await whole_message(lambda: anext(chunks, None), self._length, self._limit)
        if isinstance(found, bytes):
            return found
        return self._refusal(*found, self._request_id())

    async def _events(self) -> AsyncIterator[bytes]:
        bounds = EventBounds(self._limit, self._refused_event)
        async for chunk in self._inner:
            for events in bounds.feed(chunk):
                yield events
        rest = bounds.rest()
        if rest is not None:
            yield rest

    def _refused_event(self, event: bytes | bytearray, size: int, exact: bool) -> bytes:
        def refusal(request_id: int | str | None, size: int, exact: bool) -> bytes:
            return self._refusal(size, exact, self._request_id() if request_id is None else request_id)

        return refused_event(event, size, exact, refusal)

    async def aclose(self) -> None:
        await self._inner.aclose()


def _split_events(events: bytes) -> Iterator[bytes]:
    """Whole SSE events, each with its boundary, from bytes that end at a boundary."""
    start = 0
    while start < len(events):
        end = _boundary(events, start, last=False)
        end = len(events) if end < 0 else end
        yield events[start:end]
        start = end


def _boundary(buffer: bytes | bytearray, start: int, last: bool) -> int:
    """The index just past the first (or `last`) SSE event boundary at or after `start`, or -1."""
    if last:
        ends = [found + len(mark) for mark in _SSE_BOUNDARIES if (found := buffer.rfind(mark, start)) >= 0]
        return max(ends, default=-1)
    ends = [found + len(mark) for mark in _SSE_BOUNDARIES if (found := buffer.find(mark, start)) >= 0]
    return min(ends, default=-1)


def bound_responses(http_client: httpx2.AsyncClient, limit: int, server: str) -> httpx2.AsyncClient:
    """`http_client` with every response body read through `BoundedStream`."""
    source = f"server {server!r}"

    async def bound(response: httpx2.Response) -> None:
        response.stream = BoundedStream(response.stream, limit, response.request, response.headers, source)  # type: ignore[arg-type]

    http_client.event_hooks["response"].append(bound)
    return http_client
