"""Opaque cursors and pages for the gateway's own list responses."""

from __future__ import annotations

import base64
import json
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

__all__ = ["page"]


def _encode_cursor(offset: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"o": offset}).encode()).decode()


def _decode_cursor(cursor: str | None) -> int:
    if not cursor:
        return 0
    try:
        offset = json.loads(base64.urlsafe_b64decode(cursor.encode()))["o"]
    except (ValueError, KeyError, TypeError):
        raise MCPError(
            types.INVALID_PARAMS, f"Invalid cursor {cursor!r}: pass back a nextCursor value unchanged."
        ) from None
    if not isinstance(offset, int) or offset < 0:
        raise MCPError(types.INVALID_PARAMS, f"Invalid cursor {cursor!r}.")
    return offset


def page(items: list[Any], params: types.PaginatedRequestParams | None, size: int) -> tuple[list[Any], str | None]:
    """The page of `items` the request's cursor points at, and the cursor of the next one (None: last)."""
    offset = _decode_cursor(params.cursor if params else None)
    end = offset + size
    return items[offset:end], _encode_cursor(end) if end < len(items) else None
