"""A quick yes for the arguments of a simple inputSchema, without jsonschema's general machinery.

Most tools' schemas (what FastMCP and pydantic generate) are an object of typed properties, some
required, maybe optional (`anyOf` with `null`), lists of a type or string enums. `quick_check`
compiles such a schema into a plain predicate that costs a call a microsecond or two where
jsonschema's `iter_errors` costs tens. The predicate only ever says "valid for sure": False means
"not sure", and the caller then asks jsonschema, which decides and words the error. So a keyword
it does not know (`$ref`, `pattern`, `minimum`, `oneOf`...) makes the schema not quick at all
(None), and a value it is unsure of (an integral float for `integer`, say) is jsonschema's.

Type semantics are those of drafts 6 to 2020-12 (the validator classes `QUICK_DRAFTS`); `format`
is an annotation there unless a format checker is given, and the gateway gives none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jsonschema import Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator

__all__ = ["QUICK_DRAFTS", "Check", "quick_check"]

Check = Callable[[Any], bool]
"""True: the value is valid for sure; False: not sure (ask jsonschema)."""

QUICK_DRAFTS = (Draft6Validator, Draft7Validator, Draft201909Validator, Draft202012Validator)
"""The validator classes whose type semantics the quick checks follow."""

_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly", "$comment", "format"}
)
_OBJECT_KEYWORDS = frozenset({"properties", "required", "additionalProperties"})
_KNOWN = _ANNOTATIONS | _OBJECT_KEYWORDS | {"type", "anyOf", "items", "enum", "$schema"}


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_integer(value: Any) -> bool:  # an integral float is valid too, but jsonschema's to say
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_boolean(value: Any) -> bool:
    return isinstance(value, bool)


def _is_null(value: Any) -> bool:
    return value is None


def _is_object(value: Any) -> bool:
    return isinstance(value, dict)


def _is_array(value: Any) -> bool:
    return isinstance(value, list)


_TYPES: dict[str, Check] = {
    "string": _is_string,
    "integer": _is_integer,
    "number": _is_number,
    "boolean": _is_boolean,
    "null": _is_null,
    "object": _is_object,
    "array": _is_array,
}


def quick_check(schema: Any) -> Check | None:
    """The quick predicate of `schema`, or None when it holds anything the quick checks do not know.
    `schema` must already have passed the draft's `check_schema`."""
    if not isinstance(schema, dict) or not schema.keys() <= _KNOWN:
        return None
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not kinds or any(k not in _TYPES for k in kinds):
            return None
        tests = [_TYPES[k] for k in kinds]
        checks.append(tests[0] if len(tests) == 1 else (lambda value: any(test(value) for test in tests)))
    if "enum" in schema:
        values = schema["enum"]
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            return None
        allowed = frozenset(values)
        checks.append(lambda value: isinstance(value, str) and value in allowed)
    if "anyOf" in schema:
        branches = [quick_check(branch) for branch in schema["anyOf"]]
        if not branches or any(branch is None for branch in branches):
            return None
        either: list[Check] = [b for b in branches if b is not None]
        checks.append(lambda value: any(branch(value) for branch in either))
    if "items" in schema:
        item = quick_check(schema["items"])
        if item is None:
            return None
        checks.append(lambda value: not isinstance(value, list) or all(item(v) for v in value))
    if schema.keys() & _OBJECT_KEYWORDS:
        members = _object_check(schema)
        if members is None:
            return None
        checks.append(members)
    return _all(checks)


def _object_check(schema: dict[str, Any]) -> Check | None:
    """`properties`, `required` and `additionalProperties` (applied to objects only, as in JSON Schema)."""
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        return None
    compiled: dict[str, Check] = {}
    for name, sub in properties.items():
        check = quick_check(sub)
        if check is None:
            return None
        compiled[name] = check
    required = schema.get("required", [])
    if not isinstance(required, list):
        return None
    extra = schema.get("additionalProperties", True)
    if extra is True:
        other: Check | None = None
    elif extra is False:
        other = _never
    else:
        other = quick_check(extra)
        if other is None:
            return None
    needed = tuple(required)

    def members(value: Any) -> bool:
        if not isinstance(value, dict):
            return True
        for name in needed:
            if name not in value:
                return False
        for name, item in value.items():
            check = compiled.get(name, other)
            if check is not None and not check(item):
                return False
        return True

    return members


def _never(value: Any) -> bool:
    return False


def _always(value: Any) -> bool:
    return True


def _all(checks: list[Check]) -> Check:
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return lambda value: all(check(value) for check in checks)
