"""The tools' structured outputs, and the compact pipe tables their text shows."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from .database import Rows, json_value

__all__ = ["ExecuteResult", "GeneratedSql", "InsertResult", "ResultSet", "StatementEffect", "pipe_table", "result_set"]

MAX_CELL = 200
"""Characters of one value shown in a text table; structured content keeps the whole value."""


class ResultSet(BaseModel):
    statement: str
    columns: list[str]
    rows: list[list[Any]]
    row_count: int = Field(description="Rows returned (after the max_rows cut).")
    truncated: bool = Field(description="True when the query had more rows than max_rows.")


class StatementEffect(BaseModel):
    statement: str
    kind: Literal["write", "ddl"]
    label: str = Field(description="INSERT, UPDATE, DELETE, REPLACE, UPSERT, CREATE TABLE, ...")
    target: str | None = Field(description="The table the statement changes.")
    rows_affected: int | None = Field(description="Rows inserted, updated or deleted; null for DDL.")


class ExecuteResult(BaseModel):
    """`execute_sql`'s structured output."""

    kind: Literal["read", "write"]
    dry_run: bool
    executed: bool = Field(description="True when the statements ran and their effects (if any) are committed.")
    results: list[ResultSet] = Field(default_factory=list, description="Rows of each read; plans in a dry run.")
    effects: list[StatementEffect] = Field(default_factory=list)
    total_changes: int | None = Field(
        default=None, description="Rows changed including triggers and foreign-key actions (SQLite)."
    )
    confirmation_token: str | None = Field(default=None, description="Pass it with dry_run=false to execute.")
    token_expires_at: datetime | None = None
    note: str = ""


class InsertResult(BaseModel):
    """`add_records`'s structured output."""

    table: str
    inserted: int
    ids: list[Any] = Field(description="The primary key of each new row, in order (null where there is none).")
    id_column: str | None


class GeneratedSql(BaseModel):
    """`generate_sql`'s structured output."""

    sql: str
    kind: Literal["read", "write"]
    label: str
    attempts: int = Field(description="Sampling rounds used, 1 when the first answer was valid.")
    plan: list[list[Any]] = Field(description="EXPLAIN output for the statement.")
    rejected: list[str] = Field(default_factory=list, description="Why each earlier attempt was rejected.")
    note: str


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    text = str(json_value(value)).replace("\r", " ").replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def pipe_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown pipe table; a result without columns (no result set) is an empty string."""
    if not columns:
        return ""
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + " --- |" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def result_set(statement: str, rows: Rows) -> ResultSet:
    values = [[json_value(v) for v in row] for row in rows.rows]
    return ResultSet(
        statement=statement, columns=rows.columns, rows=values, row_count=len(values), truncated=rows.truncated
    )
