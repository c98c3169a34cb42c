"""A lean request's result, checked as the SDK's session checks it, only cheaper where it is sure.

`ClientSession.send_request` validates every result twice (against the negotiated version's
schema, then as its result type) and `validate_tool_result` runs jsonschema on a tool's
structured content each call. Here the first step is skipped for the shapes that pass it for
certain (`quick_shape`: text blocks, text resource contents, text prompt messages, in either
era), and a tool's output schema is compiled once into a "valid for sure" predicate
(`gateway.quick_check`). Anything else, and every error, is the SDK's own code: the
results and the errors stay exactly those of the SDK's client.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from jsonschema import SchemaError
from jsonschema.validators import validator_for
from mcp.client.session import _clamp_inbound_ttl, _later_revision_fields
from mcp_types import methods as _methods
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.quick_check import QUICK_DRAFTS, Check, quick_check

__all__ = ["OutputChecks", "quick_shape", "surely_shaped", "validated"]

_TEXT_BLOCK = frozenset({"type", "text"})
_TEXT_CONTENTS = frozenset({"uri", "mimeType", "text"})
_MESSAGE = frozenset({"role", "content"})
_ROLES = frozenset({"user", "assistant"})
_ENVELOPE = frozenset({"_meta", "resultType", "ttlMs", "cacheScope"})
_LATER = frozenset({"resultType", "ttlMs", "cacheScope"})
"""2026-07-28's result fields: a handshake-era session drops them (the SDK's path)."""
_META = frozenset({"io.modelcontextprotocol/serverInfo"})


def _text_block(block: Any) -> bool:
    return (
        type(block) is dict
        and block.get("type") == "text"
        and type(block.get("text")) is str
        and block.keys() <= _TEXT_BLOCK
    )


def _tool_result(raw: dict[str, Any]) -> bool:
    content = raw.get("content")
    if type(content) is not list or not all(_text_block(block) for block in content):
        return False
    for key, value in raw.items():
        if key == "structuredContent":
            if type(value) is not dict:
                return False
        elif key == "isError":
            if type(value) is not bool:
                return False
        elif key != "content" and key not in _ENVELOPE:
            return False
    return True


def _resource_contents(item: Any) -> bool:
    return (
        type(item) is dict
        and type(item.get("uri")) is str
        and type(item.get("text")) is str
        and type(item.get("mimeType", "")) is str
        and item.keys() <= _TEXT_CONTENTS
    )


def _resource_result(raw: dict[str, Any]) -> bool:
    contents = raw.get("contents")
    return (
        raw.keys() - _ENVELOPE == {"contents"}
        and type(contents) is list
        and all(_resource_contents(c) for c in contents)
    )


def _message(item: Any) -> bool:
    return type(item) is dict and item.keys() == _MESSAGE and item["role"] in _ROLES and _text_block(item["content"])


def _prompt_result(raw: dict[str, Any]) -> bool:
    messages = raw.get("messages")
    if type(messages) is not list or not all(_message(m) for m in messages):
        return False
    return raw.keys() - _ENVELOPE <= {"messages", "description"} and type(raw.get("description", "")) is str


_SHAPES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "tools/call": _tool_result,
    "resources/read": _resource_result,
    "prompts/get": _prompt_result,
}


def _envelope(method: str, modern: bool, raw: dict[str, Any]) -> bool:
    """The fields around the result's own: `_meta` (only the server's identity), and on 2026-07-28
    a complete `resultType` (with a resource's cache hints), which a handshake-era result lacks."""
    if "_meta" in raw:
        meta = raw["_meta"]
        if type(meta) is not dict or not meta.keys() <= _META or type(next(iter(meta.values()), {})) is not dict:
            return False
    if not modern:
        return _LATER.isdisjoint(raw)
    if raw.get("resultType") != "complete":
        return False
    if method != "resources/read":
        return "ttlMs" not in raw and "cacheScope" not in raw
    ttl = raw.get("ttlMs")
    return type(ttl) is int and ttl >= 0 and raw.get("cacheScope") in ("private", "public")


def quick_shape(method: str, version: str, raw: dict[str, Any]) -> bool:
    """Whether `raw` passes the negotiated version's result schema for sure: the common shapes
    (text blocks, text resource contents, text prompt messages); then the SDK's check is skipped."""
    shape = _SHAPES.get(method)
    modern = version in MODERN_PROTOCOL_VERSIONS
    return shape is not None and _envelope(method, modern, raw) and shape(raw)


def surely_shaped(method: str, version: str, dumped: dict[str, Any]) -> dict[str, Any] | None:
    """`dumped` (a result the gateway serves) as `methods.serialize_server_result` would return
    it, when that is certain without running it: a common shape (`quick_shape`) once a
    handshake-era session's absent 2026-07-28 fields are dropped. None: run the SDK's."""
    if (method, version) not in _methods.SERVER_RESULTS:
        return None
    if version not in MODERN_PROTOCOL_VERSIONS and not _LATER.isdisjoint(dumped):
        dumped = {key: value for key, value in dumped.items() if key not in _LATER}
    return dumped if quick_shape(method, version, dumped) else None


def validated(session: Any, method: str, raw: dict[str, Any], adapter: Any) -> Any:
    """The result as `ClientSession.send_request` makes it: checked against the negotiated
    version's schema (unless `quick_shape`), a later revision's fields dropped, parsed by `adapter`."""
    version = session._negotiated_version or "2025-11-25"
    if not quick_shape(method, version, raw):
        _clamp_inbound_ttl(raw)
        try:
            _methods.validate_server_result(method, version, raw)
        except KeyError:
            pass
        foreign = _later_revision_fields(method, version)
        if not foreign.isdisjoint(raw):
            raw = {key: value for key, value in raw.items() if key not in foreign}
    return adapter.validate_python(raw, by_name=False)


class OutputChecks:
    """Tools' output schemas compiled once each (per schema value the session holds)."""

    def __init__(self) -> None:
        self._checks: dict[str, tuple[Any, Check | None]] = {}

    def _check(self, name: str, schema: Any) -> Check | None:
        found = self._checks.get(name)
        if found is not None and found[0] is schema:
            return found[1]
        check: Check | None = None
        cls = validator_for(schema)
        if cls in QUICK_DRAFTS:
            try:
                cls.check_schema(schema)
                check = quick_check(schema)
            except SchemaError:
                check = None  # the SDK says so, on every call
        self._checks[name] = (schema, check)
        return check

    async def validate(self, session: Any, name: str, result: types.CallToolResult) -> None:
        """`session.validate_tool_result(name, result)`, skipped when its answer is yes for sure."""
        schemas = session._tool_output_schemas
        if name in schemas:
            schema = schemas[name]
            if schema is None:
                return
            content = result.structured_content
            if content is not None:
                check = self._check(name, schema)
                if check is not None and check(content):
                    return
        await session.validate_tool_result(name, result)
