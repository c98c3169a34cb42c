"""Bounded copies of what records keep: arguments and texts cut to a byte budget, cheaply.

A call may carry megabytes (a refused 4 MB argument, a huge result); what is stored of
it is at most `records.max_argument_bytes` / `records.max_result_bytes`. Cutting never
serializes the whole value to keep its first bytes: `shrink` walks the value only until
the budget is spent (a long string is sliced, a long list or object stops), and only
that small copy is turned into JSON.

Secrets and cuts. Values under secret-looking keys are masked during the walk, before
anything is cut. A configured secret (`Masker`) is found by searching text, so a cut
through the middle of one would leave its first characters unmasked: the one string a
walk cuts is masked in full first (a C-speed `str.replace`, no copy kept), and every
kept text is masked again as a whole. So a cut can split `***`, never a secret.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from itertools import islice
from typing import Any

from gateway.config.servers import MASK
from gateway.sizes import cut_bytes, json_bytes, utf8_bytes

__all__ = [
    "MAX_NAMES",
    "MAX_NAME_BYTES",
    "TRUNCATED_KEY",
    "cut_text",
    "refused_summary",
    "shrink",
    "size_estimate",
    "storable",
    "truncated_arguments",
]

TRUNCATED_KEY = "_truncated"
"""The marker of stored arguments that are not the call's full arguments."""
MAX_NAMES = 100
"""A refused call's summary names at most this many arguments..."""
MAX_NAME_BYTES = 200
"""... each in at most this many bytes."""
ELLIPSIS = "…"
_NODE_BYTES = 8
"""What `size_estimate` counts for a number, a key's quotes, a comma: the order of magnitude is enough."""

IsSecret = Callable[[str], bool]
Mask = Callable[[str], str]


def storable(text: str) -> str:
    """`text` as every store can keep it: a lone UTF-16 surrogate (JSON allows one, UTF-8 and so SQLite and
    PostgreSQL refuse it) as its escape `\\udXXX`, a NUL (PostgreSQL's text refuses it) as `\\u0000`.
    Applied once, to the cut texts of a row (`rows.py`), so the cost is bounded by the stored limits."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\u0000") if "\x00" in text else text


def cut_text(text: str, limit: int, mask: Mask) -> str:
    """`text` masked, then within `limit` bytes, ending with `…` when it was cut."""
    masked = mask(text)
    if len(masked) * 4 <= limit or utf8_bytes(masked) <= limit:
        return masked
    return cut_bytes(masked, limit - utf8_bytes(ELLIPSIS)) + ELLIPSIS


def size_estimate(value: Any, cap: int) -> int:
    """Roughly how many bytes `value` holds (string lengths plus a little per item), counting no further than
    `cap`: for the writer's byte bound, on the call path, in time bounded by `cap`, not by the value."""
    total = 0
    stack = [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, str | bytes):
            total += len(item) + 2
        elif isinstance(item, dict):
            total += _NODE_BYTES
            for key, inner in item.items():
                total += len(key) + 3 if isinstance(key, str) else _NODE_BYTES
                stack.append(inner)
                if total > cap:
                    break
        elif isinstance(item, list | tuple):
            total += _NODE_BYTES
            stack.extend(item[: max(cap - total, 0)])
        else:
            total += _NODE_BYTES
    return total


def shrink(value: Any, budget: int, is_secret: IsSecret, mask: Mask) -> tuple[Any, bool]:
    """A copy of JSON-like `value` with secret keys' values as `***` and configured secrets masked in every
    string, spending about `budget` characters: the string that crosses the budget is masked in full, then
    sliced, and what comes after it is left out. Returns the copy and whether anything was cut or left out."""
    flat = _flat(value, budget, is_secret, mask) if type(value) is dict else None
    if flat is not None:
        return flat, False
    return _walked(value, budget, is_secret, mask)


def _walked(value: Any, budget: int, is_secret: IsSecret, mask: Mask) -> tuple[Any, bool]:
    """`shrink`'s copy of any value, walked."""
    left = budget
    cut = False

    def text(item: str) -> str:
        nonlocal left, cut
        if len(item) + 2 <= left:
            left -= len(item) + 2
            return mask(item)
        cut = True
        kept = mask(item)[: max(left, 0)] if left > 0 else ""  # masked before the slice: it cannot split a secret
        left = 0
        return kept

    def walk(item: Any) -> Any:
        nonlocal left, cut
        if isinstance(item, str):
            return text(item)
        if isinstance(item, dict):
            copy: dict[str, Any] = {}
            for key, inner in item.items():
                if left <= 0:
                    cut = True
                    break
                name = text(str(key))
                copy[name] = MASK if is_secret(str(key)) else walk(inner)
            return copy
        if isinstance(item, list | tuple):
            kept = []
            for inner in item:
                if left <= 0:
                    cut = True
                    break
                left -= 1
                kept.append(walk(inner))
            return kept
        left -= _NODE_BYTES
        return item

    return walk(value), cut


_SCALARS = (int, float, bool, type(None))


def _flat(value: dict[Any, Any], budget: int, is_secret: IsSecret, mask: Mask) -> dict[str, Any] | None:
    """`shrink`'s copy of an object of strings and numbers that fits in `budget` (most calls' arguments),
    spent exactly as the walk spends it, without its closures or recursion; None for any other value,
    or one the walk would cut, which the walk then copies."""
    left = budget
    copy: dict[str, Any] = {}
    for key, inner in value.items():
        if type(key) is not str or left <= 0 or len(key) + 2 > left:
            return None
        left -= len(key) + 2
        if is_secret(key):
            copy[mask(key)] = MASK
        elif type(inner) is str:
            if len(inner) + 2 > left:
                return None
            left -= len(inner) + 2
            copy[mask(key)] = mask(inner)
        elif type(inner) in _SCALARS:
            left -= _NODE_BYTES
            copy[mask(key)] = inner
        else:
            return None
    return copy


_to_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str).encode
"""`json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)`, its encoder made once."""


def _marker(original_bytes: int, **fields: Any) -> str:
    marker = {TRUNCATED_KEY: True, "original_bytes": original_bytes, **fields}
    return json.dumps(marker, ensure_ascii=False, separators=(",", ":"))


def truncated_arguments(arguments: Any, limit: int, is_secret: IsSecret, mask: Mask) -> str:
    """The arguments as stored: their redacted JSON when it fits in `limit` bytes, else
    `{"_truncated": true, "original_bytes": N, "preview": "<the JSON's first bytes>"}` within `limit`
    (N is the size the client sent: the one full pass over the value, only for arguments that were cut)."""
    shrunk, cut = shrink(arguments, limit, is_secret, mask)
    text = _to_json(shrunk)
    if not cut and utf8_bytes(text) <= limit:
        return text
    original = json_bytes(arguments)
    preview = cut_bytes(text, limit - utf8_bytes(_marker(original, preview="")))
    stored = _marker(original, preview=preview)
    while utf8_bytes(stored) > limit and preview:  # escaping made it longer: take off the excess
        preview = cut_bytes(preview, max(utf8_bytes(preview) - (utf8_bytes(stored) - limit), 0))
        stored = _marker(original, preview=preview)
    return stored


def refused_summary(arguments: dict[str, Any] | None, mask: Mask) -> str | None:
    """What a refused call keeps of its arguments: `{"_truncated": true, "original_bytes": N, "names": [...]}`,
    the names of (at most `MAX_NAMES`) arguments, each masked then cut to `MAX_NAME_BYTES`, none of the values."""
    if arguments is None:
        return None
    names = [cut_bytes(mask(str(name)), MAX_NAME_BYTES) for name in islice(arguments, MAX_NAMES)]
    return _marker(json_bytes(arguments), names=names)
