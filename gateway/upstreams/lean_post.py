"""Lean upstream requests over streamable HTTP (`gateway.upstreams.lean_calls`): one POST each,
its JSON or SSE answer read in the caller's task.

A POST goes one of two ways. `DirectPost`, when nothing but the gateway's own hooks sits on the
session's httpx2 client (no `Auth` flow, the lean transport, no proxy): the request's head is
prebuilt for the session (the client's headers, the URL's target and Host) and only its length,
session id, stamped and trace headers are added; it is written straight on a kept-alive
connection of `gateway.upstreams.lean_http.LeanTransport`. Its answer, when a plain one (a 2xx JSON
or UTF-8 SSE body, not content-encoded), is read straight off the connection: a JSON body whole, an
SSE body event by event (`gateway.upstreams.sse_messages`), bounded as `BoundedStream` bounds it
(`gateway.upstreams.message_bounds`); once an SSE answer's event is in, the stream's end is read in
the background so that the connection is kept. Any other answer (an error status, a redirect...)
becomes the `httpx2.Response` httpx2 would have handed over. Otherwise (OAuth, httpx2's own
transport, or a redirect seen once) through the client itself, `stream_within_origin` following a
same-origin redirect.

Anything in an SSE answer that is not the request's (a sampling or elicitation request, a log or
list_changed notification) is handed to the SDK's read stream (`HttpLean.inject`, `merged_reads`),
as if the SDK had read it. Errors are the SDK transport's: the same codes and messages.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any, cast

import anyio
import anyio.abc
import httpx2
import mcp_types as types
import orjson
from mcp.client.streamable_http import MCP_SESSION_ID, _unfollowed_redirect
from mcp.shared._httpx_utils import stream_within_origin
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from opentelemetry import propagate, trace
from pydantic import ValidationError

from gateway.upstreams.lean_http import Body, LeanTransport, Origin
from gateway.upstreams.lean_wire import LeanCalls, OnLog, closed_error, outcome, report
from gateway.upstreams.message_bounds import BoundedStream, EventBounds, dropped, refused_event, whole_message
from gateway.upstreams.oauth.binding import NeedsLogin, TokenEndpointDown
from gateway.upstreams.sse_messages import MessageEvents

__all__ = ["DirectPost", "HttpLean", "Posted", "merged_reads"]

logger = logging.getLogger(__name__)

_SENT = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
"""What every POST of a lean request says of itself (the SDK transport's `_prepare_headers`)."""


_SESSION_HEADER = MCP_SESSION_ID.lower().encode("ascii")
Posted = tuple[int, bytes, list[tuple[bytes, bytes]], Body]
"""An answer's status, reason, headers and body, unread (`LeanTransport.round_trip`)."""


class _Sent:
    """What `BoundedStream` reads of the request a refused answer names: its body."""

    __slots__ = ("content",)

    def __init__(self, content: bytes) -> None:
        self.content = content


class DirectPost:
    """POSTs written straight on the lean transport, with the head the httpx2 client would send."""

    def __init__(
        self,
        transport: LeanTransport,
        url: str,
        client_headers: httpx2.Headers,
        timeout: httpx2.Timeout,
        on_status: Callable[[int], None],
        max_message_bytes: int,
        server: str,
    ) -> None:
        parsed = httpx2.URL(url)
        scheme = parsed.scheme
        self.origin: Origin = (scheme, parsed.host, parsed.port or (443 if scheme == "https" else 80))
        self.target = parsed.raw_path
        self._target = self.target.decode("ascii", "replace")
        self.url = url
        self._request = httpx2.Request("POST", parsed)
        """What an answer names as its request (httpx2's SSE reader and errors read its URL)."""
        self._host = parsed.netloc
        self._client_headers = client_headers
        self._transport = transport
        self._timeouts = timeout.as_dict()
        self._on_status = on_status
        self.limit = max_message_bytes
        self.source = f"server {server!r}"
        self._trace = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        """A tracer provider is installed: the trace context goes in a header (`transports._reporting`)."""
        self._prefix = b""
        self._prefix_for: tuple[str | None, tuple[str, ...]] | None = None

    def _head_prefix(self, session_id: str | None, names: tuple[str, ...]) -> bytes:
        """The request line, Host and every header fixed for the session: the client's, except
        those a request sets itself (`names`), then `_SENT` and the session id. Rebuilt when the
        session id or the per-request header names change."""
        key = (session_id, names)
        if self._prefix_for != key:
            lines = [b"POST " + self.target + b" HTTP/1.1", b"Host: " + self._host]
            fixed = {**_SENT, MCP_SESSION_ID: session_id} if session_id else dict(_SENT)
            overridden = {name.lower() for name in fixed} | {name.lower() for name in names}
            for name, value in self._client_headers.raw:
                if name.decode("latin-1").lower() not in overridden:
                    lines.append(name + b": " + value)
            lines += [name.encode("latin-1") + b": " + value.encode("latin-1") for name, value in fixed.items()]
            self._prefix = b"\r\n".join(lines) + b"\r\n"
            self._prefix_for = key
        return self._prefix

    async def post(self, body: bytes, session_id: str | None, headers: dict[str, str]) -> Posted:
        """Send one POST; its answer's status (reported), reason, headers and unread body."""
        if self._trace:
            headers = dict(headers)
            propagate.inject(headers)
        head = self._head_prefix(session_id, tuple(headers))
        if headers:
            head += b"".join(
                name.encode("latin-1") + b": " + value.encode("latin-1") + b"\r\n" for name, value in headers.items()
            )
        data = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        status, reason, raw_headers, stream = await self._transport.round_trip(
            self.origin, "POST", self._target, data, self._timeouts
        )
        self._on_status(status)
        return status, reason, raw_headers, stream

    def response(self, posted: Posted, body: bytes) -> httpx2.Response:
        """An answer as httpx2's client would give it, its body bounded (`BoundedStream`): for what
        the lean reading leaves to httpx2 (`HttpLean._plain`)."""
        status, reason, raw_headers, stream = posted
        response_headers = httpx2.Headers(raw_headers)
        bounded = BoundedStream(stream, self.limit, cast(httpx2.Request, _Sent(body)), response_headers, self.source)
        return httpx2.Response(
            status,
            headers=response_headers,
            stream=bounded,
            request=self._request,
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": reason},
        )


class HttpLean(LeanCalls):
    """Lean requests over streamable HTTP: POSTed through the session's httpx2 client, answered on the POST."""

    def __init__(self, url: str, on_log: OnLog | None = None) -> None:
        super().__init__(on_log)
        self.url = url
        self.http: httpx2.AsyncClient | None = None
        self.direct: DirectPost | None = None
        """Set while POSTs may skip the httpx2 client (`DirectPost`)."""
        self.session_id: str | None = None
        self.inject: Callable[[Any], Awaitable[None]] | None = None
        """Hands a message to the SDK's read stream (`merged_reads`)."""

    def attach(self, http: httpx2.AsyncClient, direct: DirectPost | None = None) -> None:
        """The session's httpx2 client; its `Mcp-Session-Id` is noted from its responses. `direct`:
        how to POST without it, when nothing but the gateway's own hooks sits on it."""
        self.http = http
        self.direct = direct

        async def note_session(response: httpx2.Response) -> None:
            found = response.headers.get(MCP_SESSION_ID)
            if found:
                self.session_id = found

        http.event_hooks["response"].append(note_session)

    async def exchange(self, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any) -> Any:
        if self.http is None:
            raise closed_error()
        body = orjson.dumps(message)
        try:
            direct = self.direct
            if direct is not None:
                posted = await direct.post(body, self.session_id, headers)
                plain = _plain(posted[0], posted[2])
                if plain is not None:
                    kind, session_id = plain
                    if session_id:
                        self.session_id = session_id
                    return await self._read_plain(direct, posted[3], kind, request_id, progress)
                response = direct.response(posted, body)
                try:
                    if _redirect(response):  # followed (or refused) as httpx2's path does, from now on
                        self.direct = None
                    else:
                        found = response.headers.get(MCP_SESSION_ID)
                        if found:
                            self.session_id = found
                        return await self._answer(response, request_id, progress)
                finally:
                    await response.aclose()
            sent = dict(_SENT)
            if self.session_id:
                sent[MCP_SESSION_ID] = self.session_id
            sent.update(headers)
            async with stream_within_origin(self.http, "POST", self.url, content=body, headers=sent) as response:
                return await self._answer(response, request_id, progress)
        except httpx2.TransportError as exc:
            # The SDK's transport dies of this (its session ends, the supervisor reconnects): same here.
            logger.debug("server at %s: the lean POST failed", self.url, exc_info=True)
            self.broken = True
            raise closed_error() from exc
        except (NeedsLogin, TokenEndpointDown) as exc:
            # The OAuth flow refused before the request went out. The SDK's request ends "connection
            # closed" then; the same error lets `Upstream._send` name the login or the token endpoint.
            raise MCPError(types.CONNECTION_CLOSED, str(exc)) from None

    async def _read_plain(self, direct: DirectPost, stream: Body, kind: str, request_id: str, progress: Any) -> Any:
        """A plain answer (`_plain`) read straight off the connection, bounded as `BoundedStream`
        bounds it: what `_answer` makes of the same answer through httpx2."""
        try:
            if kind == "json":
                found = await whole_message(stream.next_chunk, stream.length, direct.limit)
                if isinstance(found, bytes):
                    return outcome(_parsed_answer(found))
                size, exact = found
                return outcome(dropped(request_id, size, exact, direct.limit, direct.source))
            return await self._read_events(direct, stream, request_id, progress)
        finally:
            await stream.aclose()  # read to its end (or handed on): a no-op; else the connection is dropped

    async def _read_events(self, direct: DirectPost, stream: Body, request_id: str, progress: Any) -> Any:
        def refusal(named: int | str | None, size: int, exact: bool) -> bytes:
            return orjson.dumps(
                dropped(request_id if named is None else named, size, exact, direct.limit, direct.source)
            )

        bounds = EventBounds(direct.limit, lambda event, size, exact: refused_event(event, size, exact, refusal))
        events = MessageEvents()
        while True:
            chunk = await stream.next_chunk()
            if chunk is None:
                rest = bounds.rest()
                found = [*events.feed(rest), *events.end()] if rest is not None else events.end()
            else:
                found = [data for block in bounds.feed(chunk) for data in events.feed(block)]
            for data in found:
                answer = await self._on_event(data, request_id, progress)
                if answer is not None:
                    stream.finish_later()
                    return outcome(answer)
            if chunk is None:
                raise MCPError(types.CONNECTION_CLOSED, "SSE stream ended without a response")

    async def _on_event(self, data: bytes, request_id: str, progress: Any) -> dict[str, Any] | None:
        """One event's message: the request's answer, returned; progress on it, reported; a log
        line, relayed; anything else handed to the SDK."""
        try:
            message = orjson.loads(data)
        except orjson.JSONDecodeError:
            message = _loads_text(data.decode("utf-8", "replace"))
        if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
            return message
        params = message.get("params") if isinstance(message, dict) else None
        if (
            isinstance(message, dict)
            and message.get("method") == "notifications/progress"
            and isinstance(params, dict)
            and params.get("progressToken") == request_id
        ):
            await report(progress, params)
            return None
        if not (isinstance(message, dict) and await self.log(message)):
            await self._hand_over(data.decode("utf-8", "replace"))
        return None

    async def _answer(self, response: httpx2.Response, request_id: str, progress: Any) -> Any:
        """The result of the POST's answer, as the SDK's transport would resolve it."""
        status = response.status_code
        if status == 202:
            raise MCPError(types.INVALID_REQUEST, "server answered a request with 202 Accepted")
        redirect = _unfollowed_redirect(response)
        if redirect is not None:
            raise MCPError(types.INVALID_REQUEST, redirect)
        content_type = response.headers.get("content-type", "").lower()
        if status >= 400:
            if content_type.startswith("application/json"):
                found = _error_in(await response.aread())
                if found is not None:
                    raise MCPError.from_error_data(found)
            if status == 404:
                if self.session_id is None:
                    raise MCPError(types.METHOD_NOT_FOUND, "Not Found")
                raise MCPError(types.INVALID_REQUEST, "Session terminated")
            raise MCPError(types.INTERNAL_ERROR, "Server returned an error response")
        if content_type.startswith("application/json"):
            return outcome(_parsed_answer(await response.aread()))
        if content_type.startswith("text/event-stream"):
            return await self._events(response, request_id, progress)
        raise MCPError(types.INVALID_REQUEST, f"Unexpected content type: {content_type}")

    async def _events(self, response: httpx2.Response, request_id: str, progress: Any) -> Any:
        try:
            async for event in httpx2.EventSource(response, max_event_size=None):
                if event.event != "message" or not event.data:
                    continue
                answer = await self._on_event(event.data.encode(), request_id, progress)
                if answer is not None:
                    return outcome(answer)
        except httpx2.SSEError as exc:
            raise MCPError(types.CONNECTION_CLOSED, f"SSE stream failed: {exc}") from None
        raise MCPError(types.CONNECTION_CLOSED, "SSE stream ended without a response")

    async def _hand_over(self, data: str) -> None:
        """A message of the answer that is not ours: the SDK reads it as it would have."""
        try:
            item: Any = SessionMessage(types.jsonrpc_message_adapter.validate_json(data, by_name=False))
        except ValidationError as exc:
            item = exc
        if self.inject is not None:
            await self.inject(item)


def _loads_text(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _plain(status: int, raw_headers: list[tuple[bytes, bytes]]) -> tuple[str, str | None] | None:
    """("json" or "sse", the session id) of an answer read straight off the connection: a 2xx but
    202, not content-encoded, JSON or (in UTF-8) SSE; None leaves the answer to httpx2."""
    if not 200 <= status < 300 or status == 202:
        return None
    types_: list[bytes] = []
    sessions: list[bytes] = []
    for name, value in raw_headers:
        lower = name.lower()
        if lower == b"content-type":
            types_.append(value)
        elif lower == _SESSION_HEADER:
            sessions.append(value)
        elif lower == b"content-encoding":
            return None
    if len(types_) != 1 or len(sessions) > 1:
        return None
    content_type = types_[0].lower()
    try:
        session_id = sessions[0].decode("ascii") if sessions else None
    except UnicodeDecodeError:
        return None
    if content_type.startswith(b"application/json"):
        return "json", session_id
    if content_type.startswith(b"text/event-stream") and (
        b"charset" not in content_type or b"charset=utf-8" in content_type.replace(b" ", b"").replace(b'"', b"")
    ):
        return "sse", session_id
    return None


def _redirect(response: httpx2.Response) -> bool:
    """Whether an answer is a redirect (which the direct path leaves to `stream_within_origin`)."""
    return 300 <= response.status_code < 400 and "location" in response.headers


def _error_in(body: bytes) -> types.ErrorData | None:
    try:
        message = orjson.loads(body)
        error = message.get("error") if isinstance(message, dict) and "result" not in message else None
        return types.ErrorData.model_validate(error) if isinstance(error, dict) else None
    except (orjson.JSONDecodeError, ValidationError):
        return None


def _parsed_answer(body: bytes) -> dict[str, Any]:
    """A JSON answer; one that is not a JSON-RPC response fails as the SDK's transport says it."""
    try:
        message = orjson.loads(body)
    except orjson.JSONDecodeError:
        message = None
    if isinstance(message, dict) and "method" not in message and ("result" in message or "error" in message):
        return message
    try:
        types.jsonrpc_message_adapter.validate_json(body, by_name=False)
        detail = "not a response"
    except ValidationError as exc:
        detail = str(exc)
    raise MCPError(types.PARSE_ERROR, f"Failed to parse JSON response: {detail}")


class _MergedReads:
    """The SDK's read stream with `HttpLean`'s hand-overs mixed in, each message with the
    contextvars it was sent in (`last_context`, which the SDK's dispatcher reads)."""

    def __init__(self, receive: anyio.abc.ObjectReceiveStream[tuple[Any, Any]]) -> None:
        self._receive = receive
        self.last_context: Any = None

    async def __aenter__(self) -> _MergedReads:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> _MergedReads:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def receive(self) -> Any:
        item, self.last_context = await self._receive.receive()
        return item

    async def aclose(self) -> None:
        await self._receive.aclose()


@asynccontextmanager
async def merged_reads(read: Any, channel: HttpLean) -> AsyncIterator[_MergedReads]:
    """`read` (the SDK transport's read stream) as `_MergedReads`, `channel` handing over into it."""
    send, receive = anyio.create_memory_object_stream[tuple[Any, Any]](0)

    async def inject(item: Any) -> None:
        with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await send.send((item, contextvars.copy_context()))

    async def pump() -> None:
        async with send:
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                async for item in read:
                    await send.send((item, getattr(read, "last_context", None)))

    channel.inject = inject
    async with anyio.create_task_group() as tg:
        tg.start_soon(pump)
        try:
            yield _MergedReads(receive)
        finally:
            tg.cancel_scope.cancel()
