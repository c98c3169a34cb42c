"""The console's "Try a tool" form: fields made from a tool's `inputSchema`, and the posted form read
back into arguments, with an error per parameter that names it.

Pure: no request, no gateway. A parameter a form field can say (a string, a number, an integer, a
boolean, one of an enum's values) gets that field; anything else (objects, arrays, unions, no type)
gets a JSON text area for that parameter. A whole-arguments JSON text area (`RAW_FIELD`) covers what
the schema does not describe at all; when filled, it is taken instead of the fields. Range, length
and pattern checks are left to the call chain's validation layer, which checks every call the same
way; this only turns text into the JSON types the schema names.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FIELD_PREFIX", "RAW_FIELD", "Field", "FormErrors", "ToolForm", "form_for", "parse_form", "posted_values"]

FIELD_PREFIX = "arg."
"""Posted field names are `arg.<parameter>`, apart from the page's own fields (`csrf`, `tool`...)."""
RAW_FIELD = "raw_json"
"""The whole-arguments JSON object; when not blank it is used instead of the fields."""

Kind = Literal["string", "integer", "number", "boolean", "enum", "json"]
_SCALARS: dict[str, Kind] = {"string": "string", "integer": "integer", "number": "number", "boolean": "boolean"}


@dataclass(frozen=True)
class Field:
    """One parameter as a form field."""

    name: str
    kind: Kind
    required: bool
    description: str = ""
    default: str = ""
    """The text the field starts with: the schema's default, written as the field takes it."""
    choices: tuple[tuple[str, str], ...] = ()
    """For `enum` and `boolean`: (posted value, label) pairs; a posted enum value is the JSON of the option."""
    type_label: str = ""
    """What the field takes, in a word or two (`integer`, `array of string`, `JSON`)."""

    @property
    def input_name(self) -> str:
        return FIELD_PREFIX + self.name


@dataclass(frozen=True)
class ToolForm:
    """The fields of one tool's form, in the schema's order (required ones first)."""

    fields: tuple[Field, ...]
    open_ended: bool = False
    """The schema names no parameter, or says others are allowed: the raw JSON area is shown open."""

    def field(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


@dataclass
class FormErrors(Exception):
    """The posted form could not be turned into arguments: one message per parameter (or `RAW_FIELD`)."""

    errors: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return "; ".join(self.errors.values())


def _single_type(schema: Mapping[str, Any]) -> str | None:
    """The schema's one JSON type (a nullable `["string", "null"]` counts as "string"), else None."""
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def _label(schema: Mapping[str, Any]) -> str:
    kind = _single_type(schema)
    if kind == "array":
        items = schema.get("items")
        inner = _single_type(items) if isinstance(items, Mapping) else None
        return f"array of {inner}" if inner else "array"
    return kind or "JSON"


def _field(name: str, schema: Any, required: bool) -> Field:
    if not isinstance(schema, Mapping):
        return Field(name, "json", required, type_label="JSON")
    description = str(schema.get("description") or "")
    has_default = "default" in schema
    default = schema.get("default")
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        choices = tuple(
            (json.dumps(value), str(value) if isinstance(value, str) else json.dumps(value)) for value in enum
        )
        start = json.dumps(default) if has_default else ""
        return Field(name, "enum", required, description, start, choices, "one of")
    kind = _single_type(schema)
    if kind in _SCALARS and not any(key in schema for key in ("anyOf", "oneOf", "allOf")):
        scalar = _SCALARS[kind]
        if scalar == "boolean":
            start = ("true" if default else "false") if has_default and isinstance(default, bool) else ""
            return Field(name, "boolean", required, description, start, (("true", "true"), ("false", "false")), kind)
        start = "" if not has_default or default is None else str(default)
        return Field(name, scalar, required, description, start, type_label=kind)
    start = json.dumps(default, indent=2) if has_default else ""
    return Field(name, "json", required, description, start, type_label=_label(schema))


def form_for(schema: Mapping[str, Any] | None) -> ToolForm:
    """The form for a tool's `inputSchema`: one field per property, required ones first."""
    schema = schema or {}
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    required_list = schema.get("required")
    required = {str(n) for n in required_list} if isinstance(required_list, list) else set()
    names = [n for n in properties if n in required] + [n for n in properties if n not in required]
    fields = tuple(_field(str(n), properties[n], n in required) for n in names)
    extra = schema.get("additionalProperties")
    open_ended = not properties or extra is True or isinstance(extra, Mapping)
    return ToolForm(fields, open_ended=open_ended)


def posted_values(form: ToolForm, posted: Mapping[str, str]) -> dict[str, str]:
    """What the user typed, by field input name (and `RAW_FIELD`): kept for a retry, as typed."""
    names = [f.input_name for f in form.fields] + [RAW_FIELD]
    return {name: posted[name] for name in names if name in posted}


def _parse_value(item: Field, text: str) -> Any:
    """The JSON value a field's text stands for; raises ValueError with a sentence for under its field
    (which names the parameter: the sentence does not repeat it, nor carry markup)."""
    if item.kind == "string":
        return text
    if item.kind == "integer":
        try:
            return int(text.strip())
        except ValueError:
            raise ValueError(f"Must be an integer; got {text!r:.60}.") from None
    if item.kind == "number":
        try:
            number = float(text.strip())
        except ValueError:
            raise ValueError(f"Must be a number; got {text!r:.60}.") from None
        if not math.isfinite(number):
            raise ValueError(f"Must be a finite number; got {text!r:.60}.")
        return int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
    if item.kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError(f"Must be true or false; got {text!r:.60}.")
        return text == "true"
    if item.kind == "enum":
        allowed = [value for value, _ in item.choices]
        if text not in allowed:
            labels = ", ".join(label for _, label in item.choices)
            raise ValueError(f"Must be one of {labels}; got {text!r:.60}.")
        return json.loads(text)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise ValueError(f"Must be JSON ({item.type_label}): {exc.msg} at {where}.") from None


def parse_form(form: ToolForm, posted: Mapping[str, str]) -> dict[str, Any]:
    """The arguments a posted form stands for; raises `FormErrors` naming each parameter that is wrong.

    A blank optional field is left out (the tool's own default applies); a blank required one is an
    error. A filled `RAW_FIELD` must be a JSON object and is taken instead of the fields.
    """
    raw = posted.get(RAW_FIELD, "").strip()
    if raw:
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            message = f"The arguments must be JSON: {exc.msg} at line {exc.lineno} column {exc.colno}."
            raise FormErrors({RAW_FIELD: message}) from None
        if not isinstance(value, dict):
            raise FormErrors({RAW_FIELD: f"The arguments must be a JSON object; got {type(value).__name__}."})
        return value
    arguments: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for item in form.fields:
        text = posted.get(item.input_name, "")
        if text.strip() == "" and not (item.kind == "string" and text):
            if item.required:
                errors[item.name] = "Required."
            continue
        try:
            arguments[item.name] = _parse_value(item, text)
        except ValueError as exc:
            errors[item.name] = str(exc)
    if errors:
        raise FormErrors(errors)
    return arguments
