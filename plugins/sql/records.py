"""Checking `add_records` input against the schema before anything is written.

Each column's declared type is reduced to a kind (SQLite's affinity rules, §3.1 of
"Datatypes In SQLite", refined with the common names that mean a date, a boolean or
JSON; PostgreSQL's type names map the same way). A value must fit its column's kind,
field names must be columns, and a NOT NULL column with no default must be given.
Every problem of every record is reported at once, with the closest column name for a
misspelt field.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from .schema import Column, Schema, Table

__all__ = ["MAX_RECORDS", "RecordsInvalid", "column_kind", "find_table", "prepare_records"]

Kind = Literal["integer", "real", "numeric", "boolean", "text", "datetime", "blob", "json", "any"]

MAX_RECORDS = 1000
_EXPECTED: dict[Kind, str] = {
    "integer": "an integer",
    "real": "a number",
    "numeric": "a number",
    "boolean": "true/false (or 0/1)",
    "text": "a string",
    "datetime": "an ISO 8601 string such as '2025-03-04' or '2025-03-04 14:30:00'",
    "blob": "a string",
    "json": "any JSON value",
    "any": "a string, number or boolean",
}


class RecordsInvalid(ValueError):
    """The records do not fit the table; the message lists every problem."""


def column_kind(declared: str) -> Kind:
    """The kind of value a column takes, from its declared type."""
    name = declared.upper()
    if "BOOL" in name:
        return "boolean"
    if "JSON" in name:
        return "json"
    if "INT" in name or name == "SERIAL" or name.endswith("SERIAL"):
        return "integer"
    if any(word in name for word in ("CHAR", "CLOB", "TEXT", "UUID", "CITEXT")):
        return "text"
    if "BLOB" in name or "BYTEA" in name:
        return "blob"
    if any(word in name for word in ("DATE", "TIME", "INTERVAL")):
        return "datetime"
    if any(word in name for word in ("REAL", "FLOA", "DOUB")):
        return "real"
    if not name:
        return "any"
    if any(word in name for word in ("NUMERIC", "DECIMAL")):
        return "numeric"
    return "any"


def _fits(kind: Kind, value: Any) -> bool:
    if value is None or kind == "json":
        return True
    if kind == "any":
        return isinstance(value, str | int | float)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("real", "numeric"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))
    return isinstance(value, str)


def _closest(name: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, options, n=1, cutoff=0.5) or difflib.get_close_matches(
        name.lower(), [o.lower() for o in options], n=1, cutoff=0.5
    )
    if close:
        original = next((o for o in options if o.lower() == close[0].lower()), close[0])
        return f" (did you mean {original!r}?)"
    return f" (columns: {', '.join(options)})"


def find_table(schema: Schema, name: str) -> Table:
    table = schema.table(name)
    if table is None or table.kind != "table":
        names = [t.name for t in schema.tables if t.kind == "table"]
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
        hint = f"did you mean {', '.join(repr(c) for c in close)}?" if close else f"tables: {', '.join(names)}"
        what = "is a view, not a table" if table is not None else "is not a table of this database"
        raise RecordsInvalid(f"table {name!r} {what}; {hint}")
    return table


def _required(column: Column) -> bool:
    return not column.nullable and column.default is None and not column.auto_increment


def prepare_records(table: Table, records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The records as column → value mappings ready to insert, or `RecordsInvalid` listing every problem."""
    if not records:
        raise RecordsInvalid('records is empty; give a list of objects such as [{"name": "Ada"}]')
    if len(records) > MAX_RECORDS:
        raise RecordsInvalid(f"records has {len(records)} items; at most {MAX_RECORDS} are inserted per call")
    names = [c.name for c in table.columns]
    problems: list[str] = []
    prepared: list[dict[str, Any]] = []
    for number, record in enumerate(records):
        where = f"records[{number}]"
        row: dict[str, Any] = {}
        for field, value in record.items():
            column = table.column(field)
            if column is None:
                problems.append(f"{where}: unknown field {field!r}{_closest(field, names)}")
                continue
            kind = column_kind(column.type)
            if value is None and _required(column):
                problems.append(f"{where}.{field}: is NOT NULL and has no default; give a value")
            elif not _fits(kind, value):
                problems.append(
                    f"{where}.{field}: expected {_EXPECTED[kind]} for column {field} "
                    f"({column.type or 'no declared type'}), got {json.dumps(value)[:60]}"
                )
            row[field] = json.dumps(value) if kind == "json" and isinstance(value, dict | list) else value
        missing = [c.name for c in table.columns if _required(c) and c.name not in record]
        if missing:
            problems.append(f"{where}: missing {', '.join(missing)} (NOT NULL, no default)")
        prepared.append(row)
    if problems:
        shown = problems[:20] + ([f"… and {len(problems) - 20} more problems"] if len(problems) > 20 else [])
        raise RecordsInvalid(f"nothing was inserted into {table.name}: " + "; ".join(shown))
    return prepared
