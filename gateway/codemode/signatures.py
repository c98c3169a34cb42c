"""Typed Python signatures made from tools' JSON schemas, as `describe_tools` shows them.

A model writing a program needs each tool's parameters, their types and which are required, and
what the tool returns; a Python signature says that in a fraction of the schema's tokens. Types
the mapping does not know become `Any`; nothing is dropped silently: a parameter's description
follows it in the docstring.
"""

from __future__ import annotations

import json
import keyword
from collections.abc import Mapping
from typing import Any

import mcp_types as types

__all__ = ["python_type", "signature"]

_SIMPLE = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "null": "None"}
_MAX_DEPTH = 4


def python_type(schema: Any, depth: int = 0) -> str:
    """The Python annotation for a JSON schema (a best effort; `Any` where it has no better)."""
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return "Any"
    if "enum" in schema and isinstance(schema["enum"], list):
        return "Literal[" + ", ".join(json.dumps(v) for v in schema["enum"][:20]) + "]"
    if "const" in schema:
        return f"Literal[{json.dumps(schema['const'])}]"
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list):
            return " | ".join(dict.fromkeys(python_type(s, depth + 1) for s in schema[key])) or "Any"
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(dict.fromkeys(python_type({**schema, "type": k}, depth + 1) for k in kind)) or "Any"
    if kind in _SIMPLE:
        return _SIMPLE[kind]
    if kind == "array":
        return f"list[{python_type(schema.get('items'), depth + 1)}]"
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties")
        if isinstance(properties, Mapping) and properties and depth < 2:
            required = set(schema.get("required") or ())
            fields = ", ".join(
                f"{json.dumps(k)}{'' if k in required else '?'}: {python_type(v, depth + 1)}"
                for k, v in list(properties.items())[:12]
            )
            return "{" + fields + "}"
        return "dict"
    return "Any"


def _parameter_name(name: str) -> str:
    return name if name.isidentifier() and not keyword.iskeyword(name) else f"**{{{json.dumps(name)}: ...}}"


def signature(name: str, tool: types.Tool) -> str:
    """`async def tools.name(...) -> T` with a docstring: the description, each parameter's, the result."""
    schema: Mapping[str, Any] = tool.input_schema if isinstance(tool.input_schema, Mapping) else {}
    found = schema.get("properties")
    properties: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    required = [p for p in schema.get("required") or () if p in properties]
    optional = [p for p in properties if p not in required]
    params = [f"{_parameter_name(p)}: {python_type(properties[p])}" for p in required]
    params += [f"{_parameter_name(p)}: {python_type(properties[p])} | None = None" for p in optional]
    if params:
        params.insert(0, "*")
    returns = python_type(tool.output_schema) if tool.output_schema else "str"
    if name.isidentifier() and not keyword.iskeyword(name):
        lines = [f"async def tools.{name}({', '.join(params)}) -> {returns}:"]
    else:  # `-` is allowed in exposed names, not in Python ones: the tool is called by its name
        lines = [f"# not a Python name: await call_tool({json.dumps(name)}, {{...}}) with the arguments below"]
        lines.append(f"async def call_tool({json.dumps(name)}, {{{', '.join(params[1:])}}}) -> {returns}:")
    doc = (tool.description or "").strip()
    details = [
        f"{p}: {str(properties[p].get('description')).strip()}"
        for p in [*required, *optional]
        if isinstance(properties[p], Mapping) and properties[p].get("description")
    ]
    if not tool.output_schema:
        details.append("returns: the tool's text (json.loads it when the tool answers JSON)")
    body = [doc, *details] if doc else details
    if body:
        lines.append('    """' + "\n    ".join(part.replace('"""', "'''") for part in body) + '"""')
    return "\n".join(lines)
