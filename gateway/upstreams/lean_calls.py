"""`tools/call` forwarded on the gateway's own path, beside the SDK's client (issue 29).

The SDK's `Client` costs a task per request in its transport, a pydantic model of every
message each way and a memory-stream hop per message; on a trivial upstream that is a third
of the gateway's CPU per call. Here a call is written as bytes (orjson) on the same connection
and its answer read back without going through the SDK's streams:

- stdio (`StdioLean`): the gateway owns the child's stdout reader (`gateway.upstreams.stdio_child`),
  which hands this module the lines that answer (or report progress on) a lean request; every
  other line goes to the SDK as before. Requests are written through the same pipe, one write
  per line.
- streamable HTTP (`HttpLean`): POSTed through the session's own httpx2 client (auth, headers,
  message bounds, status reports), with its `Mcp-Session-Id`; a JSON or an SSE answer is read in
  the caller's task. Anything else in an SSE answer (a sampling or elicitation request, a log or
  list_changed notification) is handed to the SDK's read stream (`HttpLean.inject`), as if the
  SDK had read it.

Lean requests use their own id space (`gw-1`, `gw-2`...: strings, the SDK's are integers). The
SDK still does the handshake, listings, subscriptions, pings and server-to-client requests, and
its session supplies what a request carries (`_stamp`: the protocol version, and on 2026-07-28
the per-request `_meta` and headers) and how a result is checked (the negotiated version's
schema, the tool's output schema). A rare answer (an input-required round, an extension's
claimed shape, a 2026 header mismatch) is finished by the SDK's client. Errors are raised as
the SDK raises them (`MCPError` with the same codes and messages), so `Upstream.request`
translates them the same way. `GATEWAY_UPSTREAMS__LEAN_CALLS=false` leaves every call to the SDK.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Any

import anyio
import anyio.abc
import httpx2
import mcp_types as types
import orjson
from anyio.streams.memory import MemoryObjectSendStream
from mcp import Client
from mcp.client.extension import ClaimContext
from mcp.client.session import _clamp_inbound_ttl, _later_revision_fields
from mcp.client.streamable_http import MCP_SESSION_ID, _unfollowed_redirect
from mcp.shared._httpx_utils import stream_within_origin
from mcp.shared._otel import inject_trace_context, otel_span
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry.trace import SpanKind
from pydantic import ValidationError

from gateway.upstreams.oauth.binding import NeedsLogin, TokenEndpointDown

__all__ = ["HttpLean", "LeanCalls", "StdioLean", "bind", "call_tool", "merged_reads"]

logger = logging.getLogger(__name__)

ID_PREFIX = "gw-"
_MARK = b'"gw-'
"""Every line that concerns a lean request has its id (or progress token) in it."""
_LOG_MARK = b'"notifications/message"'

OnLog = Callable[[types.LoggingMessageNotificationParams], Awaitable[None]]

_channels: dict[int, tuple[Client, LeanCalls]] = {}
"""The open clients with a lean path, by `id` (the SDK's `Client` is not hashable)."""


def bind(client: Client, channel: LeanCalls | None) -> None:
    """Send this client's `tools/call` through `channel` while it is open; None when it closes."""
    if channel is None:
        _channels.pop(id(client), None)
    else:
        _channels[id(client)] = (client, channel)


def channel_of(client: Client) -> LeanCalls | None:
    found = _channels.get(id(client))
    return found[1] if found is not None and found[0] is client else None


def _closed() -> MCPError:
    return MCPError(code=types.CONNECTION_CLOSED, message="Connection closed")


class LeanCalls:
    """The lean requests of one connection: ids, and what each transport does with a request."""

    def __init__(self, on_log: OnLog | None = None) -> None:
        self._ids = itertools.count(1)
        self.broken = False
        """Set when the connection failed under a lean call: the supervisor is re-making it."""
        self.on_log = on_log
        """The client's logging callback: a log line sent during a call is relayed before its answer."""

    async def log(self, message: Any) -> bool:
        """Relay a `notifications/message` in order (the SDK would in a task of its own, after the
        answer had gone on); False leaves anything else, or a malformed one, to the SDK."""
        params = message.get("params") if isinstance(message, dict) else None
        if self.on_log is None or message.get("method") != "notifications/message" or not isinstance(params, dict):
            return False
        try:
            validated = types.LoggingMessageNotificationParams.model_validate(params, by_name=False)
        except ValidationError:
            return False
        await self.on_log(validated)
        return True

    def next_id(self) -> str:
        return f"{ID_PREFIX}{next(self._ids)}"

    async def exchange(self, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any) -> Any:
        """Send `message` and return its result (a dict); the server's error as `MCPError`."""
        raise NotImplementedError


class StdioLean(LeanCalls):
    """Lean requests over a stdio child: written to its stdin, answered through `take` by its stdout reader."""

    def __init__(self, on_log: OnLog | None = None) -> None:
        super().__init__(on_log)
        self._write: Callable[[bytes], Awaitable[None]] | None = None
        self._pending: dict[str, MemoryObjectSendStream[Any]] = {}
        self._ended = False

    def attach(self, write: Callable[[bytes], Awaitable[None]]) -> None:
        """The child's stdin writer (`stdio_child`), shared with the SDK's writes."""
        self._write = write

    async def offer(self, line: bytes | dict[str, Any]) -> bool:
        """Whether `line` answers a lean request, reports its progress or is a log line sent while
        lean requests wait; it is delivered if so, else it is the SDK's. Called by the stdout
        reader, in order, for every message."""
        if not self._pending:
            return False
        if isinstance(line, bytes) and _LOG_MARK in line:
            try:
                return await self.log(orjson.loads(line))
            except orjson.JSONDecodeError:
                return False
        return self.take(line)

    def take(self, line: bytes | dict[str, Any]) -> bool:
        """`offer` for an answer or a progress report."""
        if isinstance(line, bytes):
            if _MARK not in line:
                return False
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                return False
        else:
            message = line
        if not isinstance(message, dict):
            return False
        request_id = message.get("id")
        if "method" not in message:
            target = self._pending.get(request_id) if isinstance(request_id, str) else None
            if target is None:
                return False
            target.send_nowait(message)
            return True
        params = message.get("params")
        if message.get("method") != "notifications/progress" or not isinstance(params, dict):
            return False
        token = params.get("progressToken")
        target = self._pending.get(token) if isinstance(token, str) else None
        if target is None:
            return False
        target.send_nowait(params)
        return True

    def end(self) -> None:
        """The child's stdout ended: every request waiting for an answer gets `Connection closed`."""
        self._ended = True
        for target in list(self._pending.values()):
            target.close()

    async def exchange(self, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any) -> Any:
        if self._ended or self._write is None:
            raise _closed()
        send, receive = anyio.create_memory_object_stream[dict[str, Any]](math.inf)
        self._pending[request_id] = send
        try:
            try:
                await self._write(orjson.dumps(message) + b"\n")
            except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                raise _closed() from None
            while True:
                try:
                    answer = await receive.receive()
                except anyio.EndOfStream:
                    raise _closed() from None
                if "progressToken" in answer:
                    await _report(progress, answer)
                    continue
                return _outcome(answer)
        finally:
            del self._pending[request_id]
            send.close()
            receive.close()


class HttpLean(LeanCalls):
    """Lean requests over streamable HTTP: POSTed through the session's httpx2 client, answered on the POST."""

    def __init__(self, url: str, on_log: OnLog | None = None) -> None:
        super().__init__(on_log)
        self.url = url
        self.http: httpx2.AsyncClient | None = None
        self.session_id: str | None = None
        self.inject: Callable[[Any], Awaitable[None]] | None = None
        """Hands a message to the SDK's read stream (`merged_reads`)."""

    def attach(self, http: httpx2.AsyncClient) -> None:
        """The session's httpx2 client; its `Mcp-Session-Id` is noted from its responses."""
        self.http = http

        async def note_session(response: httpx2.Response) -> None:
            found = response.headers.get(MCP_SESSION_ID)
            if found:
                self.session_id = found

        http.event_hooks["response"].append(note_session)

    async def exchange(self, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any) -> Any:
        if self.http is None:
            raise _closed()
        sent = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
        if self.session_id:
            sent[MCP_SESSION_ID] = self.session_id
        sent.update(headers)
        try:
            async with stream_within_origin(
                self.http, "POST", self.url, content=orjson.dumps(message), headers=sent
            ) as response:
                return await self._answer(response, request_id, progress)
        except httpx2.TransportError as exc:
            # The SDK's transport dies of this (its session ends, the supervisor reconnects): same here.
            logger.debug("server at %s: the lean POST failed", self.url, exc_info=True)
            self.broken = True
            raise _closed() from exc
        except (NeedsLogin, TokenEndpointDown) as exc:
            # The OAuth flow refused before the request went out. The SDK's request ends "connection
            # closed" then; the same error lets `Upstream._send` name the login or the token endpoint.
            raise MCPError(types.CONNECTION_CLOSED, str(exc)) from None

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
            return _outcome(_parsed_answer(await response.aread()))
        if content_type.startswith("text/event-stream"):
            return await self._events(response, request_id, progress)
        raise MCPError(types.INVALID_REQUEST, f"Unexpected content type: {content_type}")

    async def _events(self, response: httpx2.Response, request_id: str, progress: Any) -> Any:
        try:
            async for event in httpx2.EventSource(response, max_event_size=None):
                if event.event != "message" or not event.data:
                    continue
                try:
                    message = orjson.loads(event.data)
                except orjson.JSONDecodeError:
                    message = None
                if isinstance(message, dict) and "method" not in message and message.get("id") == request_id:
                    return _outcome(message)
                params = message.get("params") if isinstance(message, dict) else None
                if (
                    isinstance(message, dict)
                    and message.get("method") == "notifications/progress"
                    and isinstance(params, dict)
                    and params.get("progressToken") == request_id
                ):
                    await _report(progress, params)
                    continue
                if not await self.log(message):
                    await self._hand_over(event.data)
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


def _outcome(answer: dict[str, Any]) -> Any:
    """The result of a JSON-RPC response, or its error raised."""
    if "error" in answer and "result" not in answer:
        try:
            error = types.ErrorData.model_validate(answer["error"])
        except ValidationError as exc:
            raise MCPError(types.PARSE_ERROR, f"a malformed error response: {exc}") from None
        raise MCPError.from_error_data(error)
    result = answer.get("result")
    if not isinstance(result, dict):
        raise MCPError(types.PARSE_ERROR, "a response whose result is not an object")
    return result


async def _report(progress: Any, params: dict[str, Any]) -> None:
    value, total, message = params.get("progress"), params.get("total"), params.get("message")
    if progress is None or not isinstance(value, int | float) or isinstance(value, bool):
        return
    with anyio.CancelScope(shield=True):
        await progress(
            float(value),
            float(total) if isinstance(total, int | float) else None,
            message if isinstance(message, str) else None,
        )


def _meta(meta: Any) -> dict[str, Any]:
    if meta is None:
        return {}
    if hasattr(meta, "model_dump"):
        return dict(meta.model_dump(by_alias=True, mode="json", exclude_none=True))
    return dict(meta)


async def call_tool(
    client: Client, name: str, arguments: dict[str, Any] | None, progress: Any = None, meta: Any = None
) -> types.CallToolResult:
    """`client.call_tool(name, arguments, progress_callback=progress, meta=meta)`, on the lean path
    when the client has one (`bind`)."""
    channel = channel_of(client)
    if channel is None:
        return await client.call_tool(name, arguments, progress_callback=progress, meta=meta)
    if channel.broken:  # not sent: `Upstream.request` says so, and the retry waits for the new connection
        raise ConnectionRefusedError("the connection failed and is being re-made")
    session = client.session
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    out_meta = _meta(meta)
    if out_meta:
        params["_meta"] = out_meta
    data: dict[str, Any] = {"method": "tools/call", "params": params}
    opts: dict[str, Any] = {}
    session._stamp(data, opts)  # type: ignore[arg-type]
    params = data["params"]
    request_id = channel.next_id()
    with otel_span(
        f"MCP send tools/call {name}",
        kind=SpanKind.CLIENT,
        attributes={"mcp.method.name": "tools/call", "jsonrpc.request.id": request_id},
    ):
        out_meta = dict(params.get("_meta") or {})
        if progress is not None:
            out_meta["progressToken"] = request_id
        inject_trace_context(out_meta)
        if out_meta:
            params["_meta"] = out_meta
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}
        try:
            raw = await _exchange(client, channel, request_id, message, opts.get("headers") or {}, progress)
        except MCPError as exc:
            if exc.code != types.HEADER_MISMATCH or client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
                raise
            # The SDK's recovery: re-list the tool and resend.
            return await client.call_tool(name, arguments, progress_callback=progress, meta=meta)
    result = _validated(session, raw)
    if isinstance(result, types.CallToolResult):
        if not result.is_error:
            await session.validate_tool_result(name, result)
        return result
    return await _finish_rare(client, name, arguments, result, progress, meta)


async def _exchange(
    client: Client, channel: LeanCalls, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any
) -> Any:
    """`channel.exchange`; a call abandoned (cancelled, timed out) sends `notifications/cancelled`
    through the SDK, which knows each transport's rules for it (a 2026 HTTP POST is aborted instead)."""
    try:
        return await channel.exchange(request_id, message, headers, progress)
    except anyio.get_cancelled_exc_class():
        with anyio.CancelScope(shield=True), anyio.move_on_after(2):
            notice = types.CancelledNotification(
                params=types.CancelledNotificationParams(request_id=request_id, reason="cancelled by the gateway")
            )
            try:
                await client.session.send_notification(notice)
            except Exception:  # noqa: BLE001, S110 - best effort: the connection may be gone already
                pass
        raise


def _validated(session: Any, raw: dict[str, Any]) -> Any:
    """The result as the SDK's session checks it (`ClientSession.send_request`): against the
    negotiated version's schema, without a later revision's fields, as its result type."""
    _clamp_inbound_ttl(raw)
    version = session._negotiated_version or "2025-11-25"
    try:
        _methods.validate_server_result("tools/call", version, raw)
    except KeyError:
        pass
    foreign = _later_revision_fields("tools/call", version)
    if not foreign.isdisjoint(raw):
        raw = {key: value for key, value in raw.items() if key not in foreign}
    return session._call_tool_adapter.validate_python(raw, by_name=False)


async def _finish_rare(
    client: Client, name: str, arguments: dict[str, Any] | None, first: Any, progress: Any, meta: Any
) -> types.CallToolResult:
    """An input-required round or an extension's claimed shape: the rest as `Client.call_tool` does it."""
    session = client.session

    async def retry(responses: Any, state: str | None) -> Any:
        return await session.call_tool(
            name,
            arguments,
            progress_callback=progress,
            input_responses=responses,
            request_state=state,
            meta=meta,
            allow_input_required=True,
            allow_claimed=True,
        )

    result = await client._drive_input_required(first, retry)
    if isinstance(result, types.CallToolResult):
        return result
    claim = client._folded_extensions.by_model[type(result)]
    final: types.CallToolResult = await claim.resolve(
        result, ClaimContext(session=session, tool_name=name, read_timeout_seconds=None)
    )
    if not final.is_error:
        await session.validate_tool_result(name, final)
    return final


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


def lean_channel(spec: Any, on_log: OnLog | None = None) -> LeanCalls | None:
    """The lean path for a server (`gateway.upstreams.spec.UpstreamSpec`): stdio (in UTF-8, what
    orjson writes) and streamable HTTP have one; in-memory and legacy SSE servers keep the SDK's."""
    if spec.transport == "stdio" and getattr(spec.target, "encoding", "utf-8").lower().replace("-", "") == "utf8":
        return StdioLean(on_log)
    if spec.transport == "http" and isinstance(spec.target, str):
        return HttpLean(spec.target, on_log)
    return None
