"""The text that represents one tool in the router's indexes.

One document per tool, built from what the tool and its server say about themselves,
most informative parts first: the embedding model reads only the start of a long text
(all-MiniLM-L6-v2 stops at 256 word pieces, about 1,000 characters of English), so the
tool's own name and description come before its parameters, and its server's
description comes last. Each part has a character budget, cut at a word boundary, so that
one very long description cannot push everything else out.

Pure functions: no model, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.router.base import ToolRecord

__all__ = [
    "approx_tokens",
    "dense_document",
    "server_document",
    "split_identifier",
    "tool_document",
    "tool_short_name",
    "truncate",
    "truncate_tokens",
]

_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NON_WORD = re.compile(r"[^0-9A-Za-z\u00c0-\uffff]+")
_DIGIT_BOUNDARY = re.compile(r"(?<=[A-Za-z])(?=[0-9])|(?<=[0-9])(?=[A-Za-z])")
_SPACES = re.compile(r"\s+")
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"  # kana, ideographs, hangul
_CJK_CHAR = re.compile(f"[{_CJK}]")
_PIECE = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")
"""One CJK character, or a run of anything else up to a space: the units `truncate_tokens` counts."""

# Character budgets of the parts of a document, in the order they appear.
NAME_CHARS = 120
DESCRIPTION_CHARS = 600
PARAMETERS_CHARS = 300
PARAMETER_DESCRIPTION_CHARS = 60
SERVER_CHARS = 300
MAX_PARAMETERS = 12
DENSE_DESCRIPTION_TOKENS = 30
EXTRA_CHARS = 300
"""Budget of the text plugins add (`gateway_enrich_tool`), in the BM25 document."""
DENSE_EXTRA_TOKENS = 20
"""Budget of that text in the embedded document."""
"""Word pieces of the description in the embedded text (see `dense_document`)."""


def split_identifier(name: str) -> list[str]:
    """The words of an identifier: snake_case, kebab-case, camelCase, dotted, digits apart.

    `getHTTPResponse_v2` -> `["get", "http", "response", "v", "2"]`. Lowercased.
    """
    words: list[str] = []
    for chunk in _NON_WORD.split(name):
        if not chunk:
            continue
        for part in _CAMEL_BOUNDARY.split(chunk):
            words.extend(w.lower() for w in _DIGIT_BOUNDARY.split(part) if w)
    return words


def tool_short_name(record: ToolRecord) -> str:
    """The tool's name on its own server (the exposed name without its prefix if unknown)."""
    if record.original_name:
        return record.original_name
    head, sep, tail = record.name.partition("__")
    return tail if sep and tail else record.name


def truncate(text: str, limit: int) -> str:
    """`text` with whitespace collapsed, cut to at most `limit` characters at a word boundary."""
    text = _SPACES.sub(" ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    # Cut at the last space unless that loses most of the text (CJK text has no spaces).
    if space >= limit * 2 // 3:
        cut = cut[:space]
    return cut.rstrip(" ,;:-")


def approx_tokens(word: str) -> int:
    """About how many word pieces a BERT-style tokenizer makes of one whitespace-free piece."""
    if word.isalnum():  # the common case, without a loop over the characters
        return 1 if _CJK_CHAR.fullmatch(word) else 1 + len(word) // 6
    return 1 + len(word) // 6 + sum(1 for c in word if not c.isalnum())


def truncate_tokens(text: str, limit: int) -> str:
    """`text` cut after about `limit` word pieces, at a word (or CJK character) boundary.

    A character budget is unfair to CJK text, where each character is a token of its own:
    200 characters of Chinese cost four times what 200 characters of English do.
    """
    text = _SPACES.sub(" ", text).strip()
    used = 0
    for match in _PIECE.finditer(text):
        used += approx_tokens(match.group())
        if used > limit:
            return text[: match.start()].rstrip(" ,;:-")
    return text


def _parameters(schema: Mapping[str, Any] | None) -> Iterable[str]:
    if not isinstance(schema, Mapping):
        return
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return
    for count, (name, spec) in enumerate(properties.items()):
        if count >= MAX_PARAMETERS:
            return
        words = " ".join(split_identifier(str(name)))
        description = spec.get("description") if isinstance(spec, Mapping) else None
        if isinstance(description, str) and description.strip():
            yield f"{words} ({truncate(description, PARAMETER_DESCRIPTION_CHARS)})"
        else:
            yield words


def tool_document(record: ToolRecord) -> str:
    """The document indexed for one tool.

    Layout (each part cut to its budget, empty parts left out)::

        <tool name words>. <title>. <description>. Parameters: a (..), b (..).
        Server: <server name words>. <capabilities>. <server description>.
    """
    tool = record.tool
    name_words = " ".join(split_identifier(tool_short_name(record)))
    parts: list[str] = [truncate(name_words, NAME_CHARS)]
    title = getattr(tool, "title", None)
    if isinstance(title, str) and title.strip() and title.strip().lower() != name_words:
        parts.append(truncate(title, NAME_CHARS))
    if tool.description:
        parts.append(truncate(tool.description, DESCRIPTION_CHARS))
    parameters = ", ".join(_parameters(tool.input_schema))
    if parameters:
        parts.append("Parameters: " + truncate(parameters, PARAMETERS_CHARS))
    server_name = record.server_name or record.server_id
    server_parts = [" ".join(split_identifier(server_name))] if server_name else []
    if record.capabilities:
        server_parts.append(", ".join(record.capabilities))
    if record.server_description:
        server_parts.append(record.server_description)
    if server_parts:
        parts.append("Server: " + truncate(". ".join(p for p in server_parts if p), SERVER_CHARS))
    if record.extra:
        parts.append(truncate(". ".join(record.extra), EXTRA_CHARS))
    return ". ".join(p.rstrip(". ") for p in parts if p) + "."


def dense_document(record: ToolRecord) -> str:
    """The short text embedded for one tool: `<name words>. <description start>. Server: <name>`.

    About 28 word pieces on average. Embedding time grows with text length (a 115-piece
    `tool_document` costs about four times as much) and, measured on LiveMCPBench, the
    longer text ranks no better: the name and the first sentence or two carry the meaning.
    The full `tool_document` is what BM25 indexes.
    """
    name_words = " ".join(split_identifier(tool_short_name(record)))
    parts = [truncate(name_words, NAME_CHARS)]
    if record.tool.description:
        parts.append(truncate_tokens(record.tool.description, DENSE_DESCRIPTION_TOKENS))
    server_name = record.server_name or record.server_id
    if server_name:
        parts.append("Server: " + " ".join(split_identifier(server_name)))
    if record.extra:
        parts.append(truncate_tokens(". ".join(record.extra), DENSE_EXTRA_TOKENS))
    return ". ".join(p.rstrip(". ") for p in parts if p) + "."


def server_document(records: Sequence[ToolRecord]) -> str:
    """What one server is about: its name, tags and description, then its tools' names."""
    first = records[0]
    parts = [" ".join(split_identifier(first.server_name or first.server_id))]
    if first.capabilities:
        parts.append(", ".join(first.capabilities))
    if first.server_description:
        parts.append(truncate(first.server_description, 300))
    tools = ", ".join(" ".join(split_identifier(tool_short_name(r))) for r in records)
    parts.append("Tools: " + truncate(tools, 300))
    return ". ".join(parts)
