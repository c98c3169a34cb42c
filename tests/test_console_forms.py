"""The console's pure parts: the "Try a tool" form made from an inputSchema and read back, and the SVG charts."""

from __future__ import annotations

import json
import re

import pytest

from gateway.serving.admin.charts import bars, sparkline
from gateway.serving.admin.forms import RAW_FIELD, FormErrors, form_for, parse_form

SCHEMA = {
    "type": "object",
    "properties": {
        "note": {"type": "string", "description": "What to say", "default": "hi"},
        "count": {"type": "integer", "minimum": 1},
        "ratio": {"type": "number"},
        "loud": {"type": "boolean", "default": False},
        "unit": {"enum": ["c", "f", 3]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "when": {"type": ["string", "null"]},
    },
    "required": ["count", "unit"],
}


def test_a_schema_becomes_fields_of_its_types_with_required_ones_first_and_defaults_filled_in() -> None:
    form = form_for(SCHEMA)
    assert [(f.name, f.kind, f.required) for f in form.fields] == [
        ("count", "integer", True),
        ("unit", "enum", True),
        ("note", "string", False),
        ("ratio", "number", False),
        ("loud", "boolean", False),
        ("tags", "json", False),
        ("when", "string", False),
    ]
    note, loud, unit, tags = form.field("note"), form.field("loud"), form.field("unit"), form.field("tags")
    assert note is not None and (note.default, note.description) == ("hi", "What to say")
    assert loud is not None and loud.default == "false"
    assert unit is not None and unit.choices == (('"c"', "c"), ('"f"', "f"), ("3", "3"))
    assert tags is not None and tags.type_label == "array of string"
    assert not form.open_ended


def test_a_posted_form_becomes_arguments_of_the_schemas_types_and_blank_optional_fields_are_left_out() -> None:
    posted = {"arg.count": "3", "arg.unit": "3", "arg.note": "", "arg.ratio": "0.5", "arg.loud": "true"}
    posted |= {"arg.tags": '["a", "b"]', "arg.when": "", "csrf": "x"}
    assert parse_form(form_for(SCHEMA), posted) == {
        "count": 3,
        "unit": 3,
        "ratio": 0.5,
        "loud": True,
        "tags": ["a", "b"],
    }


def test_each_wrong_parameter_has_its_own_error_in_plain_words() -> None:
    posted = {"arg.count": "three", "arg.unit": '"k"', "arg.ratio": "nan", "arg.tags": "[1,"}
    with pytest.raises(FormErrors) as caught:
        parse_form(form_for(SCHEMA), posted)
    errors = caught.value.errors
    assert set(errors) == {"count", "unit", "ratio", "tags"}
    assert errors["count"] == "Must be an integer; got 'three'."
    assert errors["unit"].startswith("Must be one of c, f, 3")
    assert "finite" in errors["ratio"]
    assert errors["tags"].startswith("Must be JSON (array of string)")
    assert not [message for message in errors.values() if "`" in message], "shown as text: no markup"


def test_a_missing_required_parameter_is_told_so_under_its_field() -> None:
    with pytest.raises(FormErrors) as caught:
        parse_form(form_for(SCHEMA), {"arg.unit": '"c"'})
    assert caught.value.errors == {"count": "Required."}


def test_raw_json_is_taken_instead_of_the_fields_and_must_be_an_object() -> None:
    form = form_for(SCHEMA)
    assert parse_form(form, {RAW_FIELD: '{"count": 1, "extra": [1]}', "arg.count": "nope"}) == {
        "count": 1,
        "extra": [1],
    }
    with pytest.raises(FormErrors, match="JSON object; got list"):
        parse_form(form, {RAW_FIELD: "[1]"})
    with pytest.raises(FormErrors, match="line 1 column"):
        parse_form(form, {RAW_FIELD: "{nope"})


def test_a_schema_without_properties_offers_the_raw_json_area_open() -> None:
    assert form_for({"type": "object"}).open_ended
    assert form_for({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}).open_ended
    assert form_for(None).fields == ()


def _numbers(svg: str, attribute: str) -> list[float]:
    return [float(v) for v in re.findall(rf'{attribute}="([0-9.]+)"', svg)]


def test_a_sparkline_scales_to_its_largest_point_and_leaves_a_gap_where_one_is_missing() -> None:
    svg = sparkline([1, 4, None, 2], width=90, height=24, label="p50 <ms>", unit=" ms")
    assert svg.count("<polyline") == 1  # broken at the missing point
    assert svg.count("<circle") == 1, "the point after the gap, alone, is a dot"
    assert '<text class="scale" x="31" y="8" text-anchor="end">4 ms</text>' in svg, "the scale: its largest value"
    assert "p50 &lt;ms&gt;" in svg and "<ms>" not in svg
    ys = [float(point.split(",")[1]) for point in re.findall(r"[0-9.]+,[0-9.]+", svg)]
    assert min(ys) == pytest.approx(2.0)  # the largest point touches the top (2 px padding)
    assert sparkline([], label="x").count("<polyline") == 0


def test_a_chart_of_one_point_shows_it_with_its_scale() -> None:
    """A gateway's first minute of calls: one bar, one dot, each with the figure it stands for."""
    one_bar = bars([0] * 14 + [3], unit="/min")
    assert one_bar.count("<rect") == 1 and ">3/min</text>" in one_bar and ">0</text>" in one_bar
    one_dot = sparkline([None] * 14 + [12.5], unit=" ms")
    assert one_dot.count("<circle") == 1 and ">12 ms</text>" in one_dot and "<line" in one_dot


def test_bars_have_heights_in_proportion_and_none_for_an_empty_minute() -> None:
    svg = bars([0, 5, 10, None], width=40, height=21)
    heights = _numbers(svg, "height")[1:]  # the first is the svg's own
    assert heights == [10.0, 20.0]
    assert "<rect" not in bars([0, 0])
    json.dumps(svg)  # plain text, embeddable anywhere
