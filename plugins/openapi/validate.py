"""Check `call_api`'s inputs against the operation before anything is sent.

Parameters and the JSON request body are validated with jsonschema against the
spec's own schemas (`$ref`s resolved through a `referencing` registry holding the
whole document). OpenAPI 3.0 schemas are a dialect of JSON Schema draft 4 plus
`nullable`; they are validated as draft 4 with `nullable: true` turned into a `null`
type. OpenAPI 3.1 schemas are JSON Schema 2020-12 and are validated as such.
A problem is an `InputError` naming the parameter (`query.state`, `body.labels[0]`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4, DRAFT202012

from .render import short, type_expression
from .spec import ApiSpec, Operation, Parameter

__all__ = ["InputError", "SchemaValidator", "check_inputs", "is_json_media"]

_URI = "urn:openapi-spec"
_SCALAR_TYPES = {"integer", "number", "boolean"}


class InputError(ValueError):
    """An argument does not fit the operation; the message names it and says what fits."""


def is_json_media(media: str) -> bool:
    kind = media.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _nullable_to_type(node: Any) -> Any:
    """A copy of an OpenAPI 3.0 document where `nullable: true` schemas also accept null."""
    if isinstance(node, list):
        return [_nullable_to_type(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_type(v) for k, v in node.items()}
    if out.get("nullable") is True:
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = [kind, "null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    return out


class SchemaValidator:
    """Validates values against schemas at JSON pointers of one spec's document."""

    def __init__(self, spec: ApiSpec) -> None:
        is_30 = spec.version.startswith("3.0")
        document = _nullable_to_type(spec.document) if is_30 else spec.document
        specification = DRAFT4 if is_30 else DRAFT202012
        resource = Resource.from_contents(document, default_specification=specification)
        self._registry: Registry[Any] = Registry().with_resource(_URI, resource)
        self._cls: Any = jsonschema.Draft4Validator if is_30 else jsonschema.Draft202012Validator

    def problem(self, pointer: str, value: Any, label: str) -> str | None:
        """Why `value` does not fit the schema at `pointer`, naming `label` and the inner path; None if it fits."""
        if not pointer:
            return None
        validator = self._cls({"$ref": _URI + pointer}, registry=self._registry)
        errors = list(validator.iter_errors(value))
        if not errors:
            return None
        best = jsonschema.exceptions.best_match(errors)
        where = label + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in best.absolute_path)
        message = short(best.message, 200)
        more = f" ({len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        return f"{where}: {message}{more}"


def _coerce(value: Any, schema: Mapping[str, Any]) -> Any:
    """A string that spells the number or boolean a parameter's schema wants, as that value."""
    kind = schema.get("type")
    if not isinstance(value, str) or kind not in _SCALAR_TYPES:
        return value
    text = value.strip()
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            return float(text)
    except ValueError:
        return value
    return {"true": True, "false": False}.get(text.lower(), value)


def _unknown(kind: str, name: str, op: Operation, location: str) -> str:
    elsewhere = [p.location for p in op.parameters if p.name == name and p.location != location]
    if elsewhere:
        where = {"path": "path_params", "query": "query", "header": "headers", "cookie": "headers"}[elsewhere[0]]
        return f"{kind}.{name}: {name!r} is a {elsewhere[0]} parameter of {op.id}; pass it in `{where}`"
    known = [p.name for p in op.parameters if p.location == location]
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"known: {', '.join(known) or 'none'}"
    return f"{kind}.{name}: {op.id} has no {location} parameter {name!r}; {hint}"


def _check_group(
    op: Operation, spec: ApiSpec, validator: SchemaValidator, location: str, kind: str, given: Mapping[str, Any]
) -> dict[str, Any]:
    params: dict[str, Parameter] = {p.name: p for p in op.parameters if p.location == location}
    checked: dict[str, Any] = {}
    for name, value in given.items():
        param = params.get(name)
        if param is None:
            if location == "header":
                checked[name] = value  # any header may be sent; the spec's own are checked
                continue
            raise InputError(_unknown(kind, name, op, location))
        value = _coerce(value, param.schema)
        problem = validator.problem(param.schema_pointer, value, f"{kind}.{name}")
        if problem:
            raise InputError(f"{problem} (expected {type_expression(spec, param.schema)})")
        checked[name] = value
    for param in params.values():
        if param.required and param.name not in given:
            what = type_expression(spec, param.schema)
            description = f" — {short(param.description, 100)}" if param.description else ""
            raise InputError(f"{kind}.{param.name} is required ({what}){description}")
    return checked


@dataclass(frozen=True)
class CheckedInputs:
    path: dict[str, Any]
    query: dict[str, Any]
    headers: dict[str, Any]
    body: Any
    media: str
    """The request body's media type ("" without a body)."""


def check_inputs(
    spec: ApiSpec,
    op: Operation,
    validator: SchemaValidator,
    *,
    path_params: Mapping[str, Any],
    query: Mapping[str, Any],
    headers: Mapping[str, Any],
    body: Any,
) -> CheckedInputs:
    """The inputs, coerced where a string spells a number or boolean; InputError for the first problem."""
    path = _check_group(op, spec, validator, "path", "path_params", path_params)
    checked_query = _check_group(op, spec, validator, "query", "query", query)
    checked_headers = _check_group(op, spec, validator, "header", "headers", headers)
    if op.body is None:
        if body is not None:
            raise InputError(f"body: {op.id} ({op.title}) takes no request body")
        return CheckedInputs(path, checked_query, checked_headers, None, "")
    if body is None:
        if op.body.required:
            raise InputError(f"body is required for {op.id}; see search_api(operationId={op.id!r}) for its fields")
        return CheckedInputs(path, checked_query, checked_headers, None, "")
    media = _pick_media(op.body.content, body)
    problem = validator.problem(op.body.content.get(media, ""), body, "body") if is_json_media(media) else None
    if problem:
        raise InputError(problem)
    return CheckedInputs(path, checked_query, checked_headers, body, media)


def _pick_media(content: Mapping[str, str], body: Any) -> str:
    """JSON if the operation takes it, then a form for an object, then text for a string."""
    kinds = list(content)
    for kind in kinds:
        if is_json_media(kind):
            return kind
    if isinstance(body, Mapping):
        for kind in kinds:
            if kind.startswith(("application/x-www-form-urlencoded", "multipart/form-data")):
                return kind
    if isinstance(body, str) and kinds:
        return kinds[0]
    if not kinds:
        return "application/json"
    raise InputError(f"body: this operation takes {', '.join(kinds)}; give the body as a string of that content")
