"""Sizes and cuts in UTF-8 bytes, as the argument and result limits (`gateway.security.limits`) and the
records (`gateway.records.cut`) both measure them."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["cut_bytes", "json_bytes", "utf8_bytes"]


def utf8_bytes(text: str) -> int:
    """The size of `text` in UTF-8 (a lone surrogate, which JSON allows, counted as three bytes, not an error)."""
    return len(text.encode("utf-8", "surrogatepass"))


def json_bytes(value: Any) -> int:
    """The exact size of `value` as compact UTF-8 JSON (one full pass)."""
    return utf8_bytes(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def cut_bytes(text: str, limit: int) -> str:
    """The longest prefix of `text` within `limit` bytes of UTF-8 (never half a character); reads O(limit)."""
    if len(text) * 4 <= limit:
        return text
    head = text[: max(limit, 0)]  # a character is at least one byte: the prefix is in here
    encoded = head.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return head
    return encoded[:limit].decode("utf-8", errors="ignore")
