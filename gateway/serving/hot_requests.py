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
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import orjson
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.session import ServerSession
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import handler_exception_to_error_data
from mcp_types import INTERNAL_ERROR, ErrorData, RequestParams, RequestParamsMeta
from mcp_types import methods as spec_methods
from pydantic import BaseModel, ValidationError

from gateway.errors import ERROR_META_KEY
from gateway.records.model import FEEDBACK_TOKEN_META_KEY
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
    "passes_hot_requests",
    "request_context",
]

logger = logging.getLogger(__name__)

_M = TypeVar("_M")

HOT_METHODS = frozenset({"tools/call", "tools/list", "resources/read", "prompts/get"})
"""The requests the lean paths serve; every other one is the SDK's."""

_REQUEST_KEYS = frozenset({"jsonrpc", "id", "method", "params"})
_GATEWAY_META = frozenset({FEEDBACK_TOKEN_META_KEY, ERROR_META_KEY})
"""The gateway's own keys in a result's `_meta` (`_surely_shaped`)."""
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
    shaped = _surely_shaped(method, version, dumped)
    if shaped is not None:  # what the surface's validation and dump would give, without them
        return shaped
    try:
        return spec_methods.serialize_server_result(method, version, dumped)
    except ValidationError:
        logger.exception("handler for %r returned an invalid result", method)
        raise MCPError(code=INTERNAL_ERROR, message="Handler returned an invalid result") from None


def _surely_shaped(method: str, version: str, dumped: dict[str, Any]) -> dict[str, Any] | None:
    """`surely_shaped`, past the gateway's own `_meta` keys (the feedback token every recorded call
    carries, a gateway error's code): a result's `_meta` is a free JSON object the SDK's shaping passes
    through unchanged, so those keys are put back as they are around the shape check of the rest."""
    meta = dumped.get("_meta")
    if type(meta) is not dict or _GATEWAY_META.isdisjoint(meta):
        return surely_shaped(method, version, dumped)
    rest = {key: value for key, value in meta.items() if key not in _GATEWAY_META}
    probe = {key: value for key, value in dumped.items() if key != "_meta"}
    if rest:
        probe["_meta"] = rest
    shaped = surely_shaped(method, version, probe)  # `probe` itself, or a copy of it: either is ours
    if shaped is not None:
        shaped["_meta"] = meta
    return shaped


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


def passes_hot_requests(middleware: _M) -> _M:
    """Mark a server middleware that hands every hot request a lean path serves straight on (it acts
    only on what `hot_request` leaves to the SDK): the lean paths leave it out of their chain."""
    middleware.passes_hot_requests = True  # type: ignore[attr-defined]
    return middleware


def compose(server: Server[Any], hot: Hot) -> CallNext:
    """The server's middleware around `hot`'s handler, outermost first
    (`ServerRunner._compose_server_middleware`), less the layers that pass hot requests on
    (`passes_hot_requests`). A link hands on the layer's own awaitable: one coroutine a layer."""
    call: CallNext = partial(run_handler, hot)
    for each in reversed(_hot_layers(server)):
        call = _Link(each, call)
    return call


def _hot_layers(server: Server[Any]) -> tuple[Any, ...]:
    """The server's middleware that a hot request meets, worked out once per list of middleware."""
    layers = tuple(server.middleware)
    cached = _LAYERS.get(id(server))
    if cached is None or cached[0] != layers:
        if len(_LAYERS) > 64:  # servers come and go in tests: never more than a few at once
            _LAYERS.clear()
        kept = tuple(each for each in layers if not getattr(each, "passes_hot_requests", False))
        cached = _LAYERS[id(server)] = (layers, kept)
    return cached[1]


_LAYERS: dict[int, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
"""Server id -> (its middleware, the layers hot requests meet); the first compared on every use."""


class _Link:
    """One server middleware bound to the rest of the chain."""

    __slots__ = ("layer", "rest")

    def __init__(self, layer: Any, rest: CallNext) -> None:
        self.layer, self.rest = layer, rest

    def __call__(self, ctx: ServerRequestContext[Any, Any]) -> Awaitable[HandlerResult]:
        return self.layer(ctx, self.rest)
