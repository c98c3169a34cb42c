"""Size and count limits on tool calls: arguments in, results out, calls per session.

Request bodies are limited at the HTTP layer (`gateway.security.http_guard`, 413). Here:
arguments over `max_argument_bytes` (as compact JSON) are refused with
`invalid_arguments` before any upstream sees them; a result over `max_result_bytes`
is cut, blocks kept in order while they fit, and ends with a note saying how much was
dropped (a result with structured content loses it and is marked as an error, since half
a structure would not match the tool's output schema); a session (a handshake-era
connection: stdio, or stateful HTTP with `Mcp-Session-Id`) that has made
`max_calls_per_session` calls gets `rate_limited` results from then on. A 2026-07-28
client has no session, so only the per-caller rate limit bounds its calls.
"""

from __future__ import annotations

import math
from typing import Any

import mcp_types as types

from gateway.config.security import LimitsConfig
from gateway.errors import GatewayError, InvalidArguments
from gateway.sizes import JSON_CHAR_CEILING, cut_bytes, json_bytes, json_ceiling, utf8_bytes

__all__ = ["SessionLimitReached", "cap_result", "check_arguments", "check_session_calls"]

TRUNCATION_NOTE = "[mcp-gateway: result truncated from {size} to {limit} bytes (security.limits.max_result_bytes)]"


class SessionLimitReached(GatewayError):
    code = "rate_limited"


_ENVELOPE_CEILING = 96
"""At least what a result's keys and punctuation take:
`{"content":[],"structuredContent":,"isError":false,"_meta":,"resultType":""}`."""
_TEXT_BLOCK_CEILING = 26
"""At least what a text block's keys and punctuation take: `{"type":"text","text":""},`."""


def _text_ceiling(result: types.CallToolResult) -> float:
    """At least the result's size as JSON, read from the model when its blocks are plain text (no
    annotations, no `_meta`) and its structured content and `_meta` plain JSON; else infinity (measure it).
    A string counts as `json_ceiling` counts it, written out here: calling it per string cost this
    function a quarter more CPU (a microbenchmark with timeit, one and four blocks)."""
    ceiling = _ENVELOPE_CEILING + JSON_CHAR_CEILING * len(str(result.result_type or ""))
    for block in result.content:
        if type(block) is not types.TextContent or block.annotations is not None or block.meta is not None:
            return math.inf
        ceiling += _TEXT_BLOCK_CEILING + JSON_CHAR_CEILING * len(block.text)
    for value in (result.structured_content, result.meta):
        if value is not None:
            if not _plain_json(value):
                return math.inf
            ceiling += json_ceiling(value)
    return ceiling


def _plain_json(value: Any) -> bool:
    """Whether `value` is made of JSON's own types only (what a dump in JSON mode leaves as it is)."""
    if type(value) is dict:
        return all(type(key) is str and _plain_json(item) for key, item in value.items())
    if type(value) is list:
        return all(_plain_json(item) for item in value)
    return value is None or type(value) in (str, int, float, bool)


def check_arguments(arguments: dict[str, Any] | None, limits: LimitsConfig) -> None:
    """Refuse arguments larger than the limit, naming both sizes."""
    if arguments is None:
        return
    size = json_bytes(arguments)
    if size > limits.max_argument_bytes:
        raise InvalidArguments(
            f"The arguments are {size} bytes of JSON; the limit is {limits.max_argument_bytes} "
            "(security.limits.max_argument_bytes). Send less data per call."
        )


def check_session_calls(made: int, limits: LimitsConfig) -> None:
    """`made` counts this call too."""
    if limits.max_calls_per_session is not None and made > limits.max_calls_per_session:
        raise SessionLimitReached(
            f"This session has made {limits.max_calls_per_session} tool calls, its limit "
            "(security.limits.max_calls_per_session); open a new session to go on."
        )


def cap_result(result: Any, limits: LimitsConfig) -> Any:
    """A result within `max_result_bytes`: blocks kept in order while they fit, text cut to fit, then a note.

    A result known to fit by its ceiling (`json_ceiling`, `JSON_CHAR_CEILING` bytes a character) is not
    measured at all; a result or block known to be over by its floor (`_json_floor`) is not serialized to be measured:
    that took seconds of the event loop for a 60 MB text."""
    if not isinstance(result, types.CallToolResult):
        return result
    if _text_ceiling(result) <= limits.max_result_bytes:
        return result  # the commonest case, known without even dumping the result
    dump = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    if json_ceiling(dump) <= limits.max_result_bytes:
        return result  # the common case, known without serializing
    floor = _json_floor(dump)
    if floor <= limits.max_result_bytes:
        size = json_bytes(dump)  # within a few times the limit: cheap to measure exactly
        if size <= limits.max_result_bytes:
            return result
        said = str(size)
    else:
        said = f"at least {floor}"
    budget = limits.max_result_bytes - 200  # room for the note and the envelope
    kept: list[types.ContentBlock] = []
    for block in result.content:
        block_dump = block.model_dump(by_alias=True, mode="json", exclude_none=True)
        block_size = _json_floor(block_dump)
        if block_size <= budget:
            block_size = json_bytes(block_dump)
        if block_size <= budget:
            kept.append(block)
            budget -= block_size
        elif isinstance(block, types.TextContent) and budget > 64:
            text = cut_bytes(block.text, budget - 64)
            while text and json_bytes(text) > budget - 64:  # JSON escapes take room too
                text = cut_bytes(text, utf8_bytes(text) * 9 // 10)
            kept.append(block.model_copy(update={"text": text}))
            budget = 0
        else:
            budget = 0
        if budget <= 0:
            break
    text = TRUNCATION_NOTE.format(size=said, limit=limits.max_result_bytes)
    structured = result.structured_content is not None
    if structured:  # half a JSON structure is no structure: say so, as an error (clients skip schema checks)
        text += " The structured content was dropped, so this result is marked as an error."
    note = types.TextContent(type="text", text=text)
    return result.model_copy(
        update={"content": [*kept, note], "structured_content": None, "is_error": result.is_error or structured}
    )


LONG_STRING = 4096
"""Characters from which a string counts in `_json_floor` as its length, unserialized."""


def _json_floor(value: Any) -> int:
    """At most `json_bytes(value)` for a JSON-mode dump, and equal to it when no string is long: a long
    string counts as its characters and quotes (each character is at least one byte of UTF-8, and
    escapes only add), measured without serializing or even reading it."""
    if isinstance(value, str):
        return len(value) + 2 if len(value) >= LONG_STRING else json_bytes(value)
    if isinstance(value, dict):
        return (
            2 * len(value) + 1 + sum(_json_floor(key) + _json_floor(item) for key, item in value.items()) + (not value)
        )
    if isinstance(value, list):
        return len(value) + 1 + sum(_json_floor(item) for item in value) + (not value)
    return json_bytes(value)
