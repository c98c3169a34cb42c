"""The quick argument checks (`gateway.quick_check`): a yes is always jsonschema's yes, and the
schemas tools commonly have get a quick yes for fitting arguments."""

from __future__ import annotations

from typing import Any

import jsonschema
import mcp_types as types
import pytest

from gateway.calls.validation import ArgumentValidator
from gateway.quick_check import quick_check

FASTMCP_ECHO = {
    "properties": {"text": {"title": "Text", "type": "string"}},
    "required": ["text"],
    "title": "echoArguments",
    "type": "object",
}
RICH = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "what to find"},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "ratio": {"type": "number"},
        "exact": {"type": "boolean"},
        "order": {"type": "string", "enum": ["asc", "desc"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "when": {"type": "string", "format": "date-time"},
        "either": {"type": ["string", "integer"]},
        "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
    },
    "required": ["query"],
    "additionalProperties": False,
}

VALUES: list[Any] = [
    {},
    {"text": "hi"},
    {"text": 3},
    {"text": None},
    {"text": "hi", "more": 1},
    {"query": "x"},
    {"query": "x", "limit": 3},
    {"query": "x", "limit": None},
    {"query": "x", "limit": 2.0},
    {"query": "x", "limit": 2.5},
    {"query": "x", "limit": True},
    {"query": "x", "ratio": 0.5},
    {"query": "x", "ratio": 1},
    {"query": "x", "ratio": False},
    {"query": "x", "exact": 0},
    {"query": "x", "exact": True},
    {"query": "x", "order": "asc"},
    {"query": "x", "order": "up"},
    {"query": "x", "order": 1},
    {"query": "x", "tags": ["a", "b"]},
    {"query": "x", "tags": ["a", 3]},
    {"query": "x", "tags": "a"},
    {"query": "x", "when": "not a date"},
    {"query": "x", "either": 3},
    {"query": "x", "either": 3.5},
    {"query": "x", "extra": {"a": 1, "b": "2"}},
    {"query": "x", "extra": {"a": 1}},
    {"query": "x", "unknown": 1},
    {"query": 1},
    [],
    "text",
    None,
]


@pytest.mark.parametrize("schema", [FASTMCP_ECHO, RICH, {"type": "object"}, {}])
def test_a_quick_yes_is_always_jsonschemas_yes(schema: dict[str, Any]) -> None:
    check = quick_check(schema)
    assert check is not None
    validator = jsonschema.Draft202012Validator(schema)
    for value in VALUES:
        if check(value):
            assert validator.is_valid(value), value


def test_fitting_arguments_of_common_schemas_get_a_quick_yes() -> None:
    echo, rich = quick_check(FASTMCP_ECHO), quick_check(RICH)
    assert echo is not None and rich is not None
    assert echo({"text": "hi"}) and not echo({"text": 3}) and not echo({})
    fitting = {"query": "x", "limit": None, "ratio": 1, "order": "desc", "tags": ["a"], "extra": {"n": 2}}
    assert rich(fitting)
    assert not rich({"query": "x", "unknown": 1}) and not rich({"query": "x", "tags": ["a", 3]})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}},
        {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}},
        {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"type": "string"}}},
        {"type": "object", "properties": {"n": {"enum": [1, 2]}}},
        {"type": "object", "properties": {"n": True}},
        {"type": "object", "patternProperties": {"^x": {"type": "string"}}},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"type": "array", "items": [{"type": "string"}]},
    ],
)
def test_a_schema_with_anything_else_is_left_to_jsonschema(schema: dict[str, Any]) -> None:
    assert quick_check(schema) is None


def test_the_validator_words_errors_as_before_for_quick_schemas() -> None:
    """A schema with a quick check still gets jsonschema's error, and a draft-4 schema (integers
    differ there) none at all."""
    validator = ArgumentValidator()
    tool = types.Tool(name="t", input_schema=RICH)
    assert validator.problem("s", tool, {"query": "x", "limit": 2.0}) is None  # jsonschema's yes
    assert validator.problem("s", tool, {"query": "x", "order": "up"}) == (
        "parameter 'order': 'up' is not one of ['asc', 'desc']"
    )
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object", "properties": {}}
    assert validator._compile("s", types.Tool(name="d4", input_schema=draft4)).quick is None
    assert validator._compile("s", tool).quick is not None
