"""A database's schema as plain data, and its three renderings: Markdown, JSON and SQL DDL."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

__all__ = ["Column", "ForeignKey", "Index", "Schema", "Table", "render_schema"]

SchemaFormat = Literal["markdown", "json", "sql"]


class Column(BaseModel):
    name: str
    type: str = Field(description="Declared type, as the database reports it ('' when SQLite has none).")
    nullable: bool
    default: str | None = Field(default=None, description="Default expression, as SQL text.")
    primary_key: bool = False
    auto_increment: bool = Field(
        default=False, description="Filled by the database when omitted (SQLite INTEGER PRIMARY KEY, serial, identity)."
    )


class ForeignKey(BaseModel):
    columns: list[str]
    references_table: str
    references_columns: list[str]
    on_delete: str = "NO ACTION"
    on_update: str = "NO ACTION"


class Index(BaseModel):
    name: str
    columns: list[str]
    unique: bool


class Table(BaseModel):
    name: str
    kind: Literal["table", "view"] = "table"
    columns: list[Column]
    primary_key: list[str] = Field(default_factory=list)
    foreign_keys: list[ForeignKey] = Field(default_factory=list)
    indexes: list[Index] = Field(default_factory=list)
    ddl: str | None = Field(default=None, description="The CREATE statement the database stores (SQLite).")

    def column(self, name: str) -> Column | None:
        return next((c for c in self.columns if c.name == name), None)


class Schema(BaseModel):
    """`describe_schema`'s structured output."""

    backend: Literal["sqlite", "postgresql"]
    database: str = Field(description="The database, without credentials.")
    read_at: datetime = Field(description="When the schema was read (UTC); it is cached until refresh=true.")
    tables: list[Table]

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)


def _column_notes(table: Table, column: Column) -> str:
    notes = []
    if column.primary_key:
        notes.append("PK" + (", auto" if column.auto_increment else ""))
    for fk in table.foreign_keys:
        if column.name in fk.columns:
            target = fk.references_columns[fk.columns.index(column.name)]
            notes.append(f"→ {fk.references_table}.{target}")
    return "; ".join(notes)


def _markdown(schema: Schema) -> str:
    lines = [
        f"# Schema of {schema.database} ({schema.backend})",
        "",
        f"Read at {schema.read_at.isoformat(timespec='seconds')}; {len(schema.tables)} tables and views.",
    ]
    for table in schema.tables:
        lines += ["", f"## {table.name}" + (" (view)" if table.kind == "view" else ""), ""]
        lines += ["| column | type | null | default | key |", "| --- | --- | --- | --- | --- |"]
        for column in table.columns:
            default = f"`{column.default}`" if column.default is not None else ""
            null = "yes" if column.nullable else "NOT NULL"
            notes = _column_notes(table, column)
            lines.append(f"| {column.name} | {column.type or '—'} | {null} | {default} | {notes} |")
        if len(table.primary_key) > 1:
            lines.append(f"\nPrimary key: ({', '.join(table.primary_key)})")
        for fk in table.foreign_keys:
            lines.append(
                f"\nForeign key ({', '.join(fk.columns)}) → {fk.references_table} ({', '.join(fk.references_columns)})"
                f", on delete {fk.on_delete.lower()}"
            )
        for index in table.indexes:
            unique = "unique " if index.unique else ""
            lines.append(f"\nIndex {index.name}: {unique}({', '.join(index.columns)})")
    return "\n".join(lines) + "\n"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _generated_ddl(table: Table) -> str:
    """CREATE TABLE text built from the model, for databases that do not store their own (PostgreSQL)."""
    parts = []
    for column in table.columns:
        piece = f"  {_quote(column.name)} {column.type}".rstrip()
        if not column.nullable:
            piece += " NOT NULL"
        if column.default is not None:
            piece += f" DEFAULT {column.default}"
        parts.append(piece)
    if table.primary_key:
        parts.append(f"  PRIMARY KEY ({', '.join(_quote(c) for c in table.primary_key)})")
    for fk in table.foreign_keys:
        parts.append(
            f"  FOREIGN KEY ({', '.join(_quote(c) for c in fk.columns)}) REFERENCES {_quote(fk.references_table)} "
            f"({', '.join(_quote(c) for c in fk.references_columns)}) ON DELETE {fk.on_delete}"
        )
    return f"CREATE TABLE {_quote(table.name)} (\n" + ",\n".join(parts) + "\n)"


def _sql(schema: Schema) -> str:
    lines = [
        f"-- Schema of {schema.database} ({schema.backend}), read at {schema.read_at.isoformat(timespec='seconds')}"
    ]
    for table in schema.tables:
        lines += ["", (table.ddl or _generated_ddl(table)).rstrip(";") + ";"]
        if table.ddl is None:
            for index in table.indexes:
                unique = "UNIQUE " if index.unique else ""
                columns = ", ".join(_quote(c) for c in index.columns)
                lines.append(f"CREATE {unique}INDEX {_quote(index.name)} ON {_quote(table.name)} ({columns});")
    return "\n".join(lines) + "\n"


def render_schema(schema: Schema, format: SchemaFormat) -> str:
    """The schema as Markdown tables, as JSON, or as the CREATE statements."""
    if format == "json":
        return json.dumps(schema.model_dump(mode="json"), indent=2)
    if format == "sql":
        return _sql(schema)
    return _markdown(schema)
