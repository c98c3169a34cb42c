"""`tools/call`, `resources/read` and `prompts/get` forwarded on the gateway's own path, beside the
SDK's client (issue 29).

The SDK's `Client` costs a task per request in its transport, a pydantic model of every message
each way and a memory-stream hop per message; on a trivial upstream that was a third of the
gateway's CPU per call. Here a request is written as bytes (orjson) on the same connection and its
answer read back without going through the SDK's streams: over a stdio child
(`gateway.upstreams.lean_wire.StdioLean`) or streamable HTTP (`gateway.upstreams.lean_post.HttpLean`).

Lean requests use their own id space (`gw-1`, `gw-2`...). The SDK still does the handshake,
listings, subscriptions, pings and server-to-client requests, and its session supplies what a
request carries (`_stamp`: the protocol version, and on 2026-07-28 the per-request `_meta` and
headers; over stdio, where there are no headers, its `_meta` is read once per stamp). A result
is checked as the SDK's session checks it (`gateway.upstreams.lean_results`: the same code,
skipped only where its answer is yes for sure). A rare answer (an input-required
round, an extension's claimed shape, a 2026 header mismatch) is finished by the SDK's client.
Errors are raised as the SDK raises them (`MCPError` with the same codes and messages), so
`Upstream.request` translates them the same way. `GATEWAY_UPSTREAMS__LEAN_CALLS=false` leaves
every request to the SDK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import anyio
import mcp_types as types
from mcp import Client
from mcp.client.extension import ClaimContext
from mcp.client.session import _GetPromptResultAdapter, _ReadResourceResultAdapter
from mcp.shared._otel import inject_trace_context, otel_span
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from opentelemetry.trace import SpanKind

from gateway.tracer_provider import provider_installed
from gateway.upstreams.lean_post import HttpLean
from gateway.upstreams.lean_results import validated
from gateway.upstreams.lean_wire import LeanCalls, OnLog, StdioLean

__all__ = ["LeanCalls", "bind", "call_tool", "channel_of", "get_prompt", "lean_channel", "read_resource"]


class _Bound:
    """An open client's lean channel, and the `_meta` its session stamps on every request over stdio."""

    __slots__ = ("channel", "client", "envelope", "level", "stamp")

    def __init__(self, client: Client, channel: LeanCalls) -> None:
        self.client, self.channel = client, channel
        self.stamp: Any = None
        """The session's stamp `envelope` was read from (a new one when the session re-negotiates)."""
        self.envelope: dict[str, Any] = {}
        self.level: Any = None
        """The stamp's default log-level opt-in: a request's own wins over it."""

    def stamped(self, session: Any, meta: dict[str, Any] | None) -> dict[str, Any] | None:
        """`meta` as `session._stamp` leaves it (the 2026-07-28 envelope, nothing on the handshake era),
        from the envelope read once per stamp: the stamp writes the same keys on every request, and
        the headers it also makes are not sent over stdio."""
        stamp = session._stamp
        if stamp is not self.stamp:
            probe: dict[str, Any] = {"method": "ping", "params": {}}
            stamp(probe, {})
            self.envelope = dict(probe["params"].get("_meta") or {})
            self.level = self.envelope.pop(types.LOG_LEVEL_META_KEY, None)
            self.stamp = stamp
        if not self.envelope and self.level is None:
            return meta
        merged = {**meta, **self.envelope} if meta else dict(self.envelope)
        if self.level is not None:
            merged.setdefault(types.LOG_LEVEL_META_KEY, self.level)
        return merged


_channels: dict[int, _Bound] = {}
"""The open clients with a lean path, by `id` (the SDK's `Client` is not hashable)."""


def bind(client: Client, channel: LeanCalls | None) -> None:
    """Send this client's hot requests through `channel` while it is open; None when it closes."""
    if channel is None:
        _channels.pop(id(client), None)
    else:
        _channels[id(client)] = _Bound(client, channel)


def _bound(client: Client) -> _Bound | None:
    found = _channels.get(id(client))
    return found if found is not None and found.client is client else None


def channel_of(client: Client) -> LeanCalls | None:
    found = _bound(client)
    return found.channel if found is not None else None


def _usable(client: Client) -> _Bound | None:
    """The client's lean channel; None to leave the request to the SDK's client."""
    bound = _bound(client)
    if bound is not None and bound.channel.broken:  # not sent: `Upstream.request` says so, and retries
        raise ConnectionRefusedError("the connection failed and is being re-made")
    return bound


def _meta(meta: Any) -> dict[str, Any]:
    if meta is None:
        return {}
    if hasattr(meta, "model_dump"):
        return dict(meta.model_dump(by_alias=True, mode="json", exclude_none=True))
    return dict(meta)


async def _send(
    client: Client, bound: _Bound, method: str, params: dict[str, Any], meta: Any, progress: Any
) -> dict[str, Any]:
    """One request as `ClientSession.send_request` sends it (stamped, in a CLIENT span, the trace
    context in `_meta`), on the lean channel; its raw result."""
    channel = bound.channel
    out_meta = _meta(meta) if meta is not None else None
    headers: dict[str, str]
    if isinstance(channel, StdioLean):
        out_meta = bound.stamped(client.session, out_meta)
        if out_meta:
            params["_meta"] = out_meta
        headers = {}
    else:
        if out_meta:
            params["_meta"] = out_meta
        data: dict[str, Any] = {"method": method, "params": params}
        opts: dict[str, Any] = {}
        client.session._stamp(data, opts)  # type: ignore[arg-type]
        params = data["params"]
        headers = opts.get("headers") or {}
    request_id = channel.next_id()
    if not provider_installed():
        # No provider installed: the SDK's span would be a no-op whose (invalid) context injects
        # nothing, so there is neither here. `_meta` is the request's own (a copy, or the stamp's).
        if progress is not None:
            params["_meta"] = {**(params.get("_meta") or {}), "progressToken": request_id}
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        return cast(dict[str, Any], await _exchange(client, channel, request_id, message, headers, progress))
    target = params.get("name")
    with otel_span(
        f"MCP send {method}{f' {target}' if isinstance(target, str) else ''}",
        kind=SpanKind.CLIENT,
        attributes={"mcp.method.name": method, "jsonrpc.request.id": request_id},
    ):
        traced_meta = dict(params.get("_meta") or {})
        if progress is not None:
            traced_meta["progressToken"] = request_id
        inject_trace_context(traced_meta)
        if traced_meta:
            params["_meta"] = traced_meta
        message = {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
        return cast(dict[str, Any], await _exchange(client, channel, request_id, message, headers, progress))


async def _exchange(
    client: Client, channel: LeanCalls, request_id: str, message: dict[str, Any], headers: dict[str, str], progress: Any
) -> Any:
    """`channel.exchange`; a request abandoned (cancelled, timed out) sends `notifications/cancelled`
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


def _header_mismatch(client: Client, exc: MCPError) -> bool:
    """A 2026 header mismatch: the SDK's client recovers from it (re-lists, resends)."""
    return exc.code == types.HEADER_MISMATCH and client.protocol_version in MODERN_PROTOCOL_VERSIONS


async def call_tool(
    client: Client, name: str, arguments: dict[str, Any] | None, progress: Any = None, meta: Any = None
) -> types.CallToolResult:
    """`client.call_tool(name, arguments, progress_callback=progress, meta=meta)`, on the lean path
    when the client has one (`bind`)."""
    bound = _usable(client)
    if bound is None:
        return await client.call_tool(name, arguments, progress_callback=progress, meta=meta)
    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    try:
        raw = await _send(client, bound, "tools/call", params, meta, progress)
    except MCPError as exc:
        if not _header_mismatch(client, exc):
            raise
        return await client.call_tool(name, arguments, progress_callback=progress, meta=meta)
    session = client.session
    result = validated(session, "tools/call", raw, session._call_tool_adapter)
    if isinstance(result, types.CallToolResult):
        if not result.is_error:
            await bound.channel.outputs.validate(session, name, result)
        return result
    return await _finish_rare(client, name, arguments, result, progress, meta)


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


async def _simple(
    client: Client,
    method: str,
    params: dict[str, Any],
    meta: Any,
    adapter: Any,
    retry: Callable[[Any, str | None], Awaitable[Any]],
) -> Any:
    """A request whose only rare answer is an input-required round (`resources/read`, `prompts/get`):
    on the lean channel, that round and a header mismatch finished by the SDK's client (`retry`)."""
    bound = _usable(client)
    if bound is None:
        return None
    try:
        raw = await _send(client, bound, method, params, meta, None)
    except MCPError as exc:
        if not _header_mismatch(client, exc):
            raise
        return await client._drive_input_required(await retry(None, None), retry)
    result = validated(client.session, method, raw, adapter)
    if isinstance(result, types.InputRequiredResult):
        return await client._drive_input_required(result, retry)
    return result


async def read_resource(client: Client, uri: str, meta: Any = None) -> types.ReadResourceResult:
    """`client.read_resource(uri, meta=meta, cache_mode="bypass")`, on the lean path when the client has one."""

    async def retry(responses: Any, state: str | None) -> Any:
        return await client.session.read_resource(
            uri, input_responses=responses, request_state=state, meta=meta, allow_input_required=True
        )

    result = await _simple(client, "resources/read", {"uri": uri}, meta, _ReadResourceResultAdapter, retry)
    if result is None:
        return await client.read_resource(uri, meta=meta, cache_mode="bypass")
    assert isinstance(result, types.ReadResourceResult)
    return result


async def get_prompt(
    client: Client, name: str, arguments: dict[str, str] | None = None, meta: Any = None
) -> types.GetPromptResult:
    """`client.get_prompt(name, arguments, meta=meta)`, on the lean path when the client has one."""

    async def retry(responses: Any, state: str | None) -> Any:
        return await client.session.get_prompt(
            name, arguments, input_responses=responses, request_state=state, meta=meta, allow_input_required=True
        )

    params: dict[str, Any] = {"name": name}
    if arguments is not None:
        params["arguments"] = arguments
    result = await _simple(client, "prompts/get", params, meta, _GetPromptResultAdapter, retry)
    if result is None:
        return await client.get_prompt(name, arguments, meta=meta)
    assert isinstance(result, types.GetPromptResult)
    return result


def lean_channel(spec: Any, on_log: OnLog | None = None) -> LeanCalls | None:
    """The lean path for a server (`gateway.upstreams.spec.UpstreamSpec`): stdio (in UTF-8, what
    orjson writes) and streamable HTTP have one; in-memory and legacy SSE servers keep the SDK's."""
    if spec.transport == "stdio" and getattr(spec.target, "encoding", "utf-8").lower().replace("-", "") == "utf8":
        return StdioLean(on_log)
    if spec.transport == "http" and isinstance(spec.target, str):
        return HttpLean(spec.target, on_log)
    return None
