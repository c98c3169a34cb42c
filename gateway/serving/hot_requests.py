"""The transport-independent core of the lean paths: a hot request recognised, run, and answered.

Both downstream transports serve the hot requests of a handshake-era connection on a path of
their own (`gateway.serving.lean_path` over streamable HTTP, `gateway.serving.stdio_lean` over
stdio). What they share is here: deciding from the parsed JSON whether the SDK would accept the
request exactly as the lean path serves it (`hot_request`), the server's middleware composed
around the handler as the SDK's `ServerRunner` composes it, and the JSON-RPC answer shaped as
the SDK's runner and dispatcher shape it (`outcome`). Each transport keeps its own framing,
cancellation and back-channel.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp_types import INTERNAL_ERROR, ErrorData, RequestParams, RequestParamsMeta
from mcp_types import methods as spec_methods
from pydantic import BaseModel, ValidationError

from gateway.upstreams.lean_results import surely_shaped

__all__ = [
    "HOT_METHODS",
    "Hot",
    "HotFilter",
    "compose",
    "dump_json",
    "hot_request",
    "hot_shape",
    "is_enveloped",
    "outcome",
    "request_context",
]

logger = logging.getLogger(__name__)

HOT_METHODS = frozenset({"tools/call", "tools/list", "resources/read", "prompts/get"})
"""The requests the lean paths serve; every other one is the SDK's."""

_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_MODERN_META_KEY = "io.modelcontextprotocol/protocolVersion"
"""Only a 2026-07-28 envelope carries it (`mcp.server.runner._has_modern_envelope`): the SDK's."""


@dataclass(slots=True)
class Hot:
    """One hot request, its params validated as the SDK validates them."""

    id: str | int
    method: str
    params: dict[str, Any] | None
    meta: RequestParamsMeta | None
    typed: BaseModel
    handler: Any


@dataclass(frozen=True, slots=True)
class HotFilter:
    """What a lean path leaves to the SDK besides unusual requests: the gateway's own tools
    (search may ask the client's model), unless an upstream's tool has the same name."""

    own_tools: frozenset[str]
    catalog: Any


def hot_shape(data: Any, leave: HotFilter) -> tuple[str | int, str, dict[str, Any] | None] | None:
    """(id, method, params) of a single hot request that is neither task-augmented nor for one of
    the gateway's own tools; None otherwise. The params themselves are not validated here."""
    if not isinstance(data, dict) or data.get("jsonrpc") != "2.0" or not data.keys() <= _REQUEST_KEYS:
        return None
    method, request_id, params = data.get("method"), data.get("id"), data.get("params")
    if method not in HOT_METHODS or isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    if params is not None and (not isinstance(params, dict) or "task" in params):
        return None
    if method == "tools/call" and params is not None:
        name = params.get("name")
        if name in leave.own_tools and name not in leave.catalog.tools:
            return None
    return request_id, method, params


def is_enveloped(params: Mapping[str, Any]) -> bool:
    """Whether the params carry a 2026-07-28 envelope (`mcp.server.runner._has_modern_envelope`)."""
    meta = params.get("_meta")
    return isinstance(meta, Mapping) and _MODERN_META_KEY in meta


def hot_request(data: Any, server: Server[Any], version: str, leave: HotFilter) -> Hot | None:
    """The hot request `data` (parsed JSON) is, when the SDK would serve it as the lean path does;
    None: the SDK's (a batch, a notification or response, another method, a task-augmented call,
    a 2026-07-28 envelope, params the SDK refuses, so that its error is the error)."""
    shape = hot_shape(data, leave)
    if shape is None or shape[2] is not None and is_enveloped(shape[2]):
        return None
    request_id, method, params = shape
    entry = server.get_request_handler(method)
    if entry is None:
        return None
    try:
        spec_methods.validate_client_request(method, version, params)
        typed = entry.params_type.model_validate({} if params is None else params, by_name=False)
        meta = RequestParams.model_validate(params, by_name=False).meta if params and "_meta" in params else None
    except (ValidationError, KeyError, ValueError):
        return None
    return Hot(request_id, method, params, meta, typed, entry.handler)


async def run_handler(hot: Hot, ctx: ServerRequestContext[Any, Any]) -> HandlerResult:
    """The SDK runner's innermost step, past the validation `hot_request` did."""
    result = await hot.handler(ctx, hot.typed)
    if isinstance(result, ErrorData):
        raise MCPError.from_error_data(result)
    return result


async def outcome(call: CallNext, ctx: ServerRequestContext[Any, Any], hot: Hot) -> dict[str, Any]:
    """The JSON-RPC answer: the result shaped as the SDK's runner shapes it, or its error."""
    try:
        result = await call(ctx)
        return {"jsonrpc": "2.0", "id": hot.id, "result": serialize(hot.method, ctx.protocol_version, result)}
    except MCPError as exc:
        error = exc.error
    except Exception as exc:  # the SDK dispatcher's boundary, same answer
        found = handler_exception_to_error_data(exc)
        if found is None:
            logger.exception("handler for %r raised", hot.method)
            found = ErrorData(code=0, message=str(exc))
        error = found
    dumped = error.model_dump(by_alias=True, mode="json", exclude_unset=True)
    return {"jsonrpc": "2.0", "id": hot.id, "error": dumped}


def serialize(method: str, version: str, result: HandlerResult) -> dict[str, Any]:
    """The runner's shaping for a handshake-era core result (`ServerRunner._serialize`): the
    per-version surface (fields that version lacks dropped) and nothing else."""
    if isinstance(result, BaseModel):
        dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    else:
        dumped = dict(result or {})
    shaped = surely_shaped(method, version, dumped)
    if shaped is not None:  # what the surface's validation and dump would give, without them
        return shaped
    try:
        return spec_methods.serialize_server_result(method, version, dumped)
    except ValidationError:
        logger.exception("handler for %r returned an invalid result", method)
        raise MCPError(code=INTERNAL_ERROR, message="Handler returned an invalid result") from None


def dump_json(message: Mapping[str, Any]) -> bytes:
    """`message` as compact JSON: orjson, or the standard library for what orjson refuses (an
    integer beyond 64 bits, which a tool's structured content may hold)."""
    try:
        return orjson.dumps(message)
    except orjson.JSONEncodeError:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode()


def request_context(
    hot: Hot, channel: Any, connection: Any, lifespan_state: Any, request: Any = None
) -> ServerRequestContext[Any, Any]:
    """The handler's context, as `ServerRunner._make_context` builds it: a session over the
    request's own channel (`DispatchContext`) and the connection."""
    return ServerRequestContext(
        session=ServerSession(channel, connection, request_meta=hot.meta),
        lifespan_context=lifespan_state,
        protocol_version=connection.protocol_version,
        method=hot.method,
        params=hot.params,
        request_id=hot.id,
        meta=hot.meta,
        request=request,
    )


def compose(server: Server[Any], hot: Hot) -> CallNext:
    """The server's middleware around `hot`'s handler, outermost first
    (`ServerRunner._compose_server_middleware`)."""
    call: CallNext = partial(run_handler, hot)
    for each in reversed(server.middleware):
        call = partial(_apply, each, call)
    return call


async def _apply(middleware: Any, call_next: CallNext, ctx: ServerRequestContext[Any, Any]) -> HandlerResult:
    return await middleware(ctx, call_next)
