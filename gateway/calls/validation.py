"""Check a call's arguments against the tool's inputSchema before anything is sent.

A model that gets an argument wrong learns which parameter and what the tool expects,
in one sentence, without a round trip to the upstream (which might have acted on a
half-valid call). A schema the upstream got wrong itself is not held against the call:
it is logged once and the call goes through unchecked. Arguments that a simple schema's quick
check (`gateway.quick_check`) finds valid skip jsonschema; the rest, and every error, are its.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import jsonschema
import mcp_types as types
from jsonschema.exceptions import SchemaError, ValidationError
from jsonschema.protocols import Validator

from gateway.calls.chain import CallHandler, ToolCall
from gateway.errors import InvalidArguments
from gateway.observability import tracing
from gateway.quick_check import QUICK_DRAFTS, Check, quick_check

__all__ = ["ArgumentValidator", "signature"]

logger = logging.getLogger(__name__)


class _Compiled(NamedTuple):
    schema: object
    """The inputSchema it was compiled from (by identity: a relisted tool brings a new one)."""
    validator: Validator | None
    """None: the schema is invalid, and calls go through unchecked."""
    quick: Check | None
    """Valid for sure, without jsonschema (`gateway.quick_check`); None: always ask jsonschema."""


class ArgumentValidator:
    """The validation middleware; keeps one compiled validator per tool definition."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str], _Compiled] = {}

    def check(self, call: ToolCall) -> None:
        """Raise `invalid_arguments` naming the parameter, when the arguments do not fit the schema."""
        with tracing.span("gateway.validation"):  # nothing while tracing is off
            problem = self.problem(call.server, call.tool, call.arguments or {})
            if problem is not None:
                raise InvalidArguments(
                    f"Invalid arguments for {call.name!r}: {problem}. Expected: {signature(call.name, call.tool)}.",
                    server=call.server,
                )

    async def __call__(self, call: ToolCall, call_next: CallHandler) -> types.CallToolResult:
        self.check(call)  # `chain.compose` calls the check alone (`CheckLayer`)
        return await call_next(call)

    def problem(self, server: str, tool: types.Tool, arguments: dict[str, Any]) -> str | None:
        """What is wrong with `arguments`, naming the parameter, or None when they fit."""
        compiled = self._compile(server, tool)
        if compiled.validator is None or (compiled.quick is not None and compiled.quick(arguments)):
            return None
        error = jsonschema.exceptions.best_match(compiled.validator.iter_errors(arguments))
        return None if error is None else describe(error)

    def _compile(self, server: str, tool: types.Tool) -> _Compiled:
        key = (server, tool.name)
        cached = self._compiled.get(key)
        if cached is not None and cached.schema is tool.input_schema:
            return cached
        schema = tool.input_schema
        validator: Validator | None
        quick: Check | None = None
        try:
            cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
            cls.check_schema(schema)
            validator = cls(schema)
            if cls in QUICK_DRAFTS:
                quick = quick_check(schema)
        except SchemaError as exc:
            logger.warning("server %r: tool %r has an invalid inputSchema (%s); not validating", *key, exc.message)
            validator = None
        compiled = self._compiled[key] = _Compiled(schema, validator, quick)
        return compiled


def describe(error: ValidationError) -> str:
    """`parameter 'limit': 'ten' is not of type 'integer'`, or the message for the whole object."""
    path = list(error.absolute_path)
    if error.validator == "required" and not path:
        missing = next((name for name in error.validator_value if name not in (error.instance or {})), None)
        if missing is not None:
            return f"parameter {missing!r} is required"
    if error.validator == "additionalProperties" and not path:
        return error.message.replace("Additional properties", "unknown parameters")
    if not path:
        return f"the arguments {error.message}"
    where = str(path[0]) + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:])
    return f"parameter {where!r}: {error.message}"


def signature(name: str, tool: types.Tool) -> str:
    """`search(query: string, limit?: integer)`: what the tool takes, in one line."""
    properties = tool.input_schema.get("properties") or {}
    required = set(tool.input_schema.get("required") or [])
    parts = [
        f"{param}{'' if param in required else '?'}: {_type_of(spec)}"
        for param, spec in properties.items()
        if isinstance(spec, dict)
    ]
    return f"{name}({', '.join(parts)})"


def _type_of(spec: dict[str, Any]) -> str:
    if "enum" in spec:
        return " | ".join(repr(value) for value in spec["enum"][:8]) + (" | ..." if len(spec["enum"]) > 8 else "")
    kind = spec.get("type")
    if isinstance(kind, list):
        return " | ".join(str(k) for k in kind)
    if kind == "array" and isinstance(spec.get("items"), dict):
        return f"array of {_type_of(spec['items'])}"
    if kind:
        return str(kind)
    for combinator in ("anyOf", "oneOf"):
        if isinstance(spec.get(combinator), list):
            return " | ".join(_type_of(s) for s in spec[combinator] if isinstance(s, dict))
    return "any"
