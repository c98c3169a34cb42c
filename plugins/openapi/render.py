"""Operations and schemas as compact text a model can read in a few hundred tokens.

A schema becomes one type expression (`array<issue>`, `"open" | "closed"`,
`{id: integer, name?: string}`); a named component (`$ref`) is shown by its name, never
expanded inline, so recursive schemas cannot loop and the model looks the name up
with `search_api(schema=...)`. Objects list their properties one per line, `?` marking
optional ones, with descriptions cut short. Protobuf well-known types
(google.protobuf.Timestamp, Duration, ...) get one line instead of their long
documentation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from .spec import ApiSpec, Operation, deref, pointer_get

__all__ = ["describe_operation", "describe_schema", "short", "type_expression", "well_known"]

DESCRIPTION_CHARS = 160
OPERATION_DESCRIPTION_CHARS = 500
MAX_ENUM_VALUES = 25
MAX_INLINE_ENUM = 8
MAX_PROPERTIES = 60
MAX_INLINE_PROPERTIES = 8
MAX_RESPONSES = 8

_WRAPPER = "{} or null (google.protobuf.{}Value wrapper)"
_WELL_KNOWN: dict[str, tuple[str, str]] = {
    # normalized short name -> (type, one-line description)
    "timestamp": ("string(date-time)", 'RFC 3339 UTC time, e.g. "2024-05-01T12:00:00Z" (google.protobuf.Timestamp)'),
    "duration": ("string", 'seconds with an "s" suffix, e.g. "3.5s" (google.protobuf.Duration)'),
    "fieldmask": (
        "string",
        'comma-separated field paths in camelCase, e.g. "title,labels" (google.protobuf.FieldMask)',
    ),
    "struct": ("object", "any JSON object (google.protobuf.Struct)"),
    "value": ("any", "any JSON value (google.protobuf.Value)"),
    "listvalue": ("array", "a JSON array of any values (google.protobuf.ListValue)"),
    "nullvalue": ("null", "JSON null (google.protobuf.NullValue)"),
    "any": (
        "object",
        'a JSON object with "@type" (the message type URL) and that message\'s fields (google.protobuf.Any)',
    ),
    "empty": ("object", "an empty JSON object {} (google.protobuf.Empty)"),
    "doublevalue": ("number", _WRAPPER.format("a number", "Double")),
    "floatvalue": ("number", _WRAPPER.format("a number", "Float")),
    "int64value": ("string", _WRAPPER.format("a 64-bit integer as a string", "Int64")),
    "uint64value": ("string", _WRAPPER.format("an unsigned 64-bit integer as a string", "UInt64")),
    "int32value": ("integer", _WRAPPER.format("an integer", "Int32")),
    "uint32value": ("integer", _WRAPPER.format("an unsigned integer", "UInt32")),
    "boolvalue": ("boolean", _WRAPPER.format("a boolean", "Bool")),
    "stringvalue": ("string", _WRAPPER.format("a string", "String")),
    "bytesvalue": ("string(byte)", _WRAPPER.format("base64 bytes", "Bytes")),
    "status": ("object", "error: {code: integer, message: string, details: array<Any>} (google.rpc.Status)"),
}
_WELL_KNOWN_PREFIXES = ("googleprotobuf", "protobuf", "googlerpc", "rpc")
_WELL_KNOWN_DESCRIPTIONS = {
    "a timestamp represents a point in time": "timestamp",
    "a duration represents a signed": "duration",
    "`fieldmask` represents a set of symbolic field paths": "fieldmask",
    "`struct` represents a structured data value": "struct",
    "`value` represents a dynamically typed value": "value",
    "`any` contains an arbitrary serialized protocol buffer message": "any",
    "the `status` type defines a logical error model": "status",
}
_NOT_ALNUM = re.compile(r"[^0-9a-z]+")


def short(text: str, limit: int = DESCRIPTION_CHARS) -> str:
    """Whitespace collapsed, markdown links reduced to their text, cut at a word with `…`."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[:limit]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:.") + "…"


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~")


def well_known(name: str, schema: Mapping[str, Any] | None = None) -> tuple[str, str] | None:
    """(type, one-line description) if `name` or the schema's description is a protobuf well-known type."""
    normalized = _NOT_ALNUM.sub("", name.lower())
    for prefix in _WELL_KNOWN_PREFIXES:
        if normalized.startswith(prefix) and normalized[len(prefix) :] in _WELL_KNOWN:
            rest = normalized[len(prefix) :]
            if rest != "status" or "rpc" in prefix:
                return _WELL_KNOWN[rest]
    description = schema.get("description") if isinstance(schema, Mapping) else None
    if isinstance(description, str):
        start = " ".join(description.split()).lower()
        for opening, key in _WELL_KNOWN_DESCRIPTIONS.items():
            if start.startswith(opening):
                return _WELL_KNOWN[key]
    return None


def _enum_text(values: list[Any]) -> str:
    shown = " | ".join(repr(v) if isinstance(v, str) else str(v).lower() if v is None else str(v) for v in values)
    if len(values) > MAX_ENUM_VALUES:
        shown = " | ".join(repr(v) for v in values[:MAX_ENUM_VALUES]) + f" | … ({len(values) - MAX_ENUM_VALUES} more)"
    return shown


def type_expression(spec: ApiSpec, schema: Any, depth: int = 0) -> str:
    """One line: the schema's type, with named components by name."""
    if not isinstance(schema, Mapping):
        return "any"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = _ref_name(ref)
        target = deref(spec.document, schema)
        known = well_known(name, target)
        if known:
            return known[0]
        values = target.get("enum") if isinstance(target, Mapping) else None
        if isinstance(values, list) and len(values) <= MAX_INLINE_ENUM:
            return f"{name} ({_enum_text(values)})"
        return name
    known = well_known("", schema)
    if known:
        return known[0]
    if "const" in schema:
        return repr(schema["const"])
    if isinstance(schema.get("enum"), list):
        text = _enum_text(schema["enum"])
    else:
        text = _structural_type(spec, schema, depth)
    if schema.get("nullable") is True and not text.endswith("| null"):
        text += " | null"
    return text


def _structural_type(spec: ApiSpec, schema: Mapping[str, Any], depth: int) -> str:
    for key, joiner in (("allOf", " & "), ("oneOf", " | "), ("anyOf", " | ")):
        parts = schema.get(key)
        if isinstance(parts, list) and parts:
            texts = list(dict.fromkeys(type_expression(spec, p, depth) for p in parts))
            joined = joiner.join(texts)
            return joined if len(texts) == 1 or depth == 0 else f"({joined})"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if kind == "array" or "items" in schema:
        return f"array<{type_expression(spec, schema.get('items'), depth + 1)}>"
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and properties:
        if depth >= 2 or len(properties) > MAX_INLINE_PROPERTIES:
            return "object"
        required = set(schema.get("required") or ())
        inner = ", ".join(
            f"{name}{'' if name in required else '?'}: {type_expression(spec, sub, depth + 1)}"
            for name, sub in properties.items()
        )
        return "{" + inner + "}"
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        return f"map<string, {type_expression(spec, extra, depth + 1)}>"
    if kind in (None, "object") and not properties:
        return "object" if kind else "any"
    fmt = schema.get("format")
    return f"{kind}({fmt})" if isinstance(fmt, str) and fmt else str(kind)


def _merged_properties(
    spec: ApiSpec, schema: Any, seen: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], set[str]]:
    """An object's properties and required names, through `$ref` and allOf (cycle-safe)."""
    if isinstance(schema, Mapping) and isinstance(schema.get("$ref"), str):
        ref = schema["$ref"]
        if ref in seen:
            return {}, set()
        return _merged_properties(spec, deref(spec.document, schema), seen | {ref})
    if not isinstance(schema, Mapping):
        return {}, set()
    properties: dict[str, Any] = {}
    required: set[str] = set()
    for part in schema.get("allOf") or ():
        more, needed = _merged_properties(spec, part, seen)
        properties.update(more)
        required |= needed
    if isinstance(schema.get("properties"), Mapping):
        properties.update(schema["properties"])
    required |= {str(r) for r in schema.get("required") or ()}
    return properties, required


def _property_lines(spec: ApiSpec, schema: Any, indent: str = "  ") -> list[str]:
    properties, required = _merged_properties(spec, schema)
    lines: list[str] = []
    for count, (name, sub) in enumerate(properties.items()):
        if count == MAX_PROPERTIES:
            lines.append(f"{indent}… {len(properties) - MAX_PROPERTIES} more properties")
            break
        lines.append(indent + _field_line(spec, name, name in required, sub))
    return lines


def _field_line(spec: ApiSpec, name: str, required: bool, schema: Any) -> str:
    resolved = deref(spec.document, schema) if isinstance(schema, Mapping) else {}
    ref = schema.get("$ref") if isinstance(schema, Mapping) else None
    known = well_known(_ref_name(ref) if isinstance(ref, str) else "", resolved)
    line = f"{name}{'' if required else '?'}: {type_expression(spec, schema)}"
    description = known[1] if known else ""
    if not description and isinstance(schema, Mapping):
        raw = schema.get("description") or (resolved.get("description") if not ref else "")
        description = short(raw) if isinstance(raw, str) else ""
    notes = []
    if isinstance(resolved, Mapping):
        if resolved.get("readOnly"):
            notes.append("read-only")
        if "default" in resolved:
            notes.append(f"default {resolved['default']!r}")
        if resolved.get("deprecated"):
            notes.append("deprecated")
    if notes:
        line += f" [{', '.join(notes)}]"
    return f"{line} — {description}" if description else line


def describe_schema(spec: ApiSpec, name: str) -> str:
    """A component schema: its type, description and properties (or enum values)."""
    schema = spec.schemas[name]
    resolved = deref(spec.document, schema)
    known = well_known(name, resolved)
    if known:
        return f"{name}: {known[0]} — {known[1]}"
    head = f"{name}: {type_expression(spec, resolved) if not _is_object(resolved) else 'object'}"
    description = resolved.get("description") if isinstance(resolved, Mapping) else None
    lines = [head + (f" — {short(description, 400)}" if isinstance(description, str) and description else "")]
    if isinstance(resolved, Mapping) and isinstance(resolved.get("enum"), list):
        values = resolved["enum"]
        lines.append(f"enum values ({len(values)}): " + _enum_text(values))
    lines.extend(_property_lines(spec, resolved))
    for key in ("oneOf", "anyOf"):
        if isinstance(resolved, Mapping) and isinstance(resolved.get(key), list):
            lines.append(f"{key}: " + " | ".join(type_expression(spec, p, 1) for p in resolved[key]))
    return "\n".join(lines)


def _is_object(schema: Any) -> bool:
    if not isinstance(schema, Mapping):
        return False
    return schema.get("type") == "object" or "properties" in schema or "allOf" in schema


def _parameter_lines(op: Operation, spec: ApiSpec) -> Iterator[str]:
    for location, title in (("path", "Path"), ("query", "Query"), ("header", "Header"), ("cookie", "Cookie")):
        params = [p for p in op.parameters if p.location == location]
        if not params:
            continue
        yield f"{title} parameters:"
        for p in params:
            yield "  " + _field_line(
                spec, p.name, p.required, {**p.schema, **({"description": p.description} if p.description else {})}
            )


def describe_operation(spec: ApiSpec, op: Operation) -> str:
    """An operation's request (parameters and body) and responses, compactly."""
    lines = [f"{op.id} — {op.title}" + (" [deprecated]" if op.deprecated else "")]
    if op.summary:
        lines.append(op.summary)
    if op.description and op.description != op.summary:
        lines.append(short(op.description, OPERATION_DESCRIPTION_CHARS))
    lines.append(f"Service: {', '.join(op.tags)}")
    lines.extend(_parameter_lines(op, spec))
    if op.body is not None:
        kinds = ", ".join(op.body.content) or "no content type"
        lines.append(f"Request body ({kinds}{', required' if op.body.required else ''}):")
        pointer = next((p for p in op.body.content.values() if p), "")
        if pointer:
            schema = pointer_get(spec.document, pointer)
            properties, _ = _merged_properties(spec, schema)
            if properties:
                lines.extend(_property_lines(spec, schema))
            else:
                lines.append("  " + type_expression(spec, schema))
    lines.append("Responses:")
    for count, (status, raw) in enumerate(op.responses.items()):
        if count == MAX_RESPONSES:
            lines.append(f"  … {len(op.responses) - MAX_RESPONSES} more")
            break
        response = deref(spec.document, raw)
        if not isinstance(response, Mapping):
            continue
        content: Mapping[str, Any] = response["content"] if isinstance(response.get("content"), Mapping) else {}
        kind, media = next(iter(content.items()), ("", {}))
        schema = media.get("schema") if isinstance(media, Mapping) else None
        text = f"  {status}"
        if kind:
            text += f" ({kind}): {type_expression(spec, schema) if schema else 'unspecified'}"
        description = response.get("description")
        if isinstance(description, str) and description.strip():
            text += f" — {short(description, 80)}"
        lines.append(text)
    return "\n".join(lines)
