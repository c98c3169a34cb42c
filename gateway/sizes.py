"""Sizes and cuts in UTF-8 bytes, as the argument and result limits (`gateway.security.limits`) and the
records (`gateway.records.cut`) both measure them."""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "JSON_CHAR_CEILING",
    "cut_bytes",
    "json_bytes",
    "json_ceiling",
    "lone_surrogate",
    "surrogate_refusal",
    "utf8_bytes",
]

JSON_CHAR_CEILING = 6
"""The most bytes of JSON one character of a string becomes (`\\u001f`): `json_ceiling`'s bound, and that of
`gateway.security.limits`' ceiling read off a result's model."""


def utf8_bytes(text: str) -> int:
    """The size of `text` in UTF-8 (a lone surrogate, which JSON allows, counted as three bytes, not an error)."""
    return len(text.encode("utf-8", "surrogatepass"))


_COMPACT = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, default=str)
"""What `json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)` makes anew on every call."""


def json_bytes(value: Any) -> int:
    """The exact size of `value` as compact UTF-8 JSON (one full pass)."""
    return utf8_bytes(_COMPACT.encode(value))


def json_ceiling(value: Any) -> int:
    """At least `json_bytes(value)` for a JSON-mode dump (str, int, float, bool, None, dict, list), read
    without serializing: a string counts `JSON_CHAR_CEILING` bytes a character, so a small value is known
    to fit a limit without being measured. Anything else counts as its exact size."""
    if isinstance(value, str):
        return JSON_CHAR_CEILING * len(value) + 2
    if value is None or isinstance(value, bool):
        return 5
    if isinstance(value, int):
        return len(int.__repr__(value))
    if isinstance(value, float):
        return max(len(repr(value)), 9)  # `-Infinity`
    if isinstance(value, dict):
        return 1 + sum(_key_ceiling(key) + json_ceiling(item) + 2 for key, item in value.items()) + (not value)
    if isinstance(value, list):
        return 1 + sum(json_ceiling(item) + 1 for item in value) + (not value)
    return json_bytes(value)


def _key_ceiling(key: Any) -> int:
    """A key is written as a string (`1` as `"1"`, `True` as `"true"`)."""
    return JSON_CHAR_CEILING * len(key if isinstance(key, str) else str(key)) + 2


def cut_bytes(text: str, limit: int) -> str:
    """The longest prefix of `text` within `limit` bytes of UTF-8 (never half a character); reads O(limit)."""
    if len(text) * 4 <= limit:
        return text
    head = text[: max(limit, 0)]  # a character is at least one byte: the prefix is in here
    encoded = head.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return head
    return encoded[:limit].decode("utf-8", errors="ignore")


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds its first lone UTF-16 surrogate (JSON allows `\\ud800`, UTF-8 does not), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def surrogate_refusal(name: str, text: str) -> str | None:
    """Why `text`, given as `name`, cannot be written to a file or a database, or None when it can: a
    sentence for a tool error (plugins check their inputs with it before writing)."""
    at = lone_surrogate(text)
    if at is None:
        return None
    return (
        f"{name} holds a lone UTF-16 surrogate (\\u{ord(text[at]):04x}) at character {at}: it is not valid "
        "Unicode, so it cannot be stored or run; send the text without it"
    )
