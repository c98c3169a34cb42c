"""PostgreSQL through psycopg 3, one connection per call.

Time limits are `statement_timeout`, set for the call's transaction only
(`set_config(..., true)`), so the server itself cancels a statement that runs too long.
Reads run in a READ ONLY transaction, each query wrapped (`_BOUNDED`) so that the server
itself refuses a row longer than `max_value_bytes` (as `pg_column_size` measures the row: its
values as stored, decompressed; bytea is sent as hex, twice that) and stops sending rows once they
hold `max_value_bytes` in all: the client never receives a 200 MB value to find out it is
too big (libpq reads a row whole before psycopg sees it). The password comes from the environment
variable the config names; it is passed to the driver separately and never appears
in a label, a log line or an error message.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from .database import DatabaseError, QueryTimeout, Rows, WriteOutcome
from .interrupt import Interrupt, QueryInterrupted, interruptible
from .schema import Column, ForeignKey, Index, Schema, Table

__all__ = ["PostgresDatabase", "redact_url"]

_ACTIONS = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}

_COLUMNS = """
SELECT c.relname, c.relkind, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid),
       a.attidentity <> '' OR coalesce(pg_get_expr(d.adbin, d.adrelid), '') LIKE 'nextval(%'
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm')
ORDER BY c.relname, a.attnum
"""

_CONSTRAINTS = """
SELECT c.relname, k.contype,
       ARRAY(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY u(n, i)
             JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.n ORDER BY u.i),
       f.relname,
       ARRAY(SELECT a.attname FROM unnest(k.confkey) WITH ORDINALITY u(n, i)
             JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.n ORDER BY u.i),
       k.confdeltype, k.confupdtype
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN pg_class f ON f.oid = k.confrelid
WHERE n.nspname = current_schema() AND k.contype IN ('p', 'f')
ORDER BY c.relname, k.conname
"""

_INDEXES = """
SELECT t.relname, i.relname, x.indisunique,
       ARRAY(SELECT pg_get_indexdef(x.indexrelid, k, true) FROM generate_series(1, x.indnkeyatts) k)
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = current_schema()
ORDER BY t.relname, i.relname
"""


_OWN = "mcp-gateway row bytes"
_TOTAL = "mcp-gateway bytes so far"
_TOO_LONG = "mcp-gateway: a row longer than max_value_bytes, in bytes:"
_BOUNDED = f"""SELECT * FROM (
  SELECT r.*, sum(r."{_OWN}") OVER (ROWS UNBOUNDED PRECEDING) AS "{_TOTAL}" FROM (
    SELECT q.*, CASE WHEN s.n > %(longest)s THEN ('{_TOO_LONG} ' || s.n)::int ELSE s.n END AS "{_OWN}"
    FROM (SELECT * FROM (
{{statement}}
    ) AS inner_query OFFSET 0) AS q, LATERAL (SELECT pg_column_size(q.*) AS n) AS s
    LIMIT %(rows)s
  ) AS r
) AS w WHERE w."{_TOTAL}" - w."{_OWN}" <= %(budget)s"""
"""A read with two columns added: each row's size (the server raises `_TOO_LONG` past `longest`)
and the running total; only rows that start within `budget` are sent, so at most one row past
it (at most `longest` bytes) is read, and dropped. `OFFSET 0` keeps the planner from inlining
the read into each use of its columns (a 200 MB value was computed three times)."""


def redact_url(url: str) -> str:
    """The URL without a password, for labels and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" if parts.username else f":***@{host}"
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


def psycopg_errors() -> Any:
    """psycopg's error classes (psycopg is imported only when PostgreSQL is used)."""
    import psycopg

    return psycopg.errors


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class PostgresDatabase:
    backend: Literal["postgresql"] = "postgresql"

    def __init__(self, url: str, *, password_env: str | None, read_only: bool, max_value_bytes: int = 1 << 20) -> None:
        self.url = url
        self.max_value_bytes = max_value_bytes
        """Longest row (as text) a read may return, and most bytes of rows one call returns."""
        self.password_env = password_env
        self.read_only = read_only
        self.label = redact_url(url)

    @contextmanager
    def _connect(self, *, read_only: bool, timeout_ms: int) -> Iterator[Any]:
        try:
            import psycopg
        except ImportError:
            raise DatabaseError("PostgreSQL needs the psycopg package: pip install 'psycopg[binary]'") from None
        password = os.environ.get(self.password_env) if self.password_env else None
        if self.password_env and password is None:
            raise DatabaseError(f"the environment variable {self.password_env} (password_env) is not set")
        try:
            connection = psycopg.connect(self.url, password=password, connect_timeout=10, autocommit=False)
        except psycopg.Error as error:
            raise DatabaseError(f"cannot connect to {self.label}: {self._clean(error)}") from None
        interrupt: Interrupt | None = None
        try:
            with interruptible(connection.cancel) as interrupt:  # a cancelled call's statement is cancelled
                connection.read_only = read_only or self.read_only
                connection.execute("SELECT set_config('statement_timeout', %s, true)", (f"{timeout_ms}ms",))
                yield connection
        except psycopg.errors.QueryCanceled:
            if interrupt is not None and interrupt.fired:
                raise QueryInterrupted("the statement was stopped: its call was cancelled") from None
            raise QueryTimeout(f"the statement was stopped after its time limit of {timeout_ms} ms") from None
        except psycopg.Error as error:
            raise DatabaseError(self._clean(error)) from None
        finally:
            connection.close()  # closing without a commit rolls back whatever is still open

    def _clean(self, error: Exception) -> str:
        message = str(error).strip()
        password = os.environ.get(self.password_env) if self.password_env else None
        if password:
            message = message.replace(password, "***")
        return message.replace(self.url, self.label)

    def read_schema(self) -> Schema:
        with self._connect(read_only=True, timeout_ms=10_000) as db:
            columns = db.execute(_COLUMNS).fetchall()
            constraints = db.execute(_CONSTRAINTS).fetchall()
            indexes = db.execute(_INDEXES).fetchall()
        tables: dict[str, Table] = {}
        for relation, kind, name, type_, not_null, default, auto in columns:
            table = tables.setdefault(
                relation, Table(name=relation, kind="view" if kind in ("v", "m") else "table", columns=[])
            )
            table.columns.append(
                Column(name=name, type=type_, nullable=not not_null, default=default, auto_increment=bool(auto))
            )
        for relation, kind, source, target, target_columns, on_delete, on_update in constraints:
            table = tables[relation]
            if kind == "p":
                table.primary_key = list(source)
                for column in table.columns:
                    column.primary_key = column.name in source
            else:
                table.foreign_keys.append(
                    ForeignKey(
                        columns=list(source),
                        references_table=target,
                        references_columns=list(target_columns),
                        on_delete=_ACTIONS.get(on_delete, "NO ACTION"),
                        on_update=_ACTIONS.get(on_update, "NO ACTION"),
                    )
                )
        for relation, name, unique, keys in indexes:
            if relation in tables:
                tables[relation].indexes.append(Index(name=name, columns=list(keys), unique=bool(unique)))
        return Schema(
            backend="postgresql", database=self.label, read_at=datetime.now(UTC), tables=list(tables.values())
        )

    def explain(self, sql: str, timeout_ms: int) -> Rows:
        # Plain EXPLAIN plans without executing; the transaction is rolled back all the same.
        with self._connect(read_only=False, timeout_ms=timeout_ms) as db:
            rows = db.execute("EXPLAIN " + sql).fetchall()
        return Rows(columns=["QUERY PLAN"], rows=[[r[0]] for r in rows])

    def query(self, statements: Sequence[str], timeout_ms: int, max_rows: int) -> list[Rows]:
        results = []
        budget = self.max_value_bytes
        with self._connect(read_only=True, timeout_ms=timeout_ms) as db:
            for statement in statements:
                bounds = {"longest": self.max_value_bytes, "rows": max_rows + 1, "budget": budget}
                try:
                    cursor = db.execute(_BOUNDED.replace("{statement}", statement.replace("%", "%%")), bounds)
                except psycopg_errors().InvalidTextRepresentation as error:
                    if _TOO_LONG not in str(error):
                        raise
                    size = str(error).split(_TOO_LONG, 1)[1].split('"', 1)[0].strip()
                    raise DatabaseError(
                        f"a row of {size} bytes is longer than max_value_bytes ({self.max_value_bytes}); "
                        "select a part of it (left, substring, length) instead"
                    ) from None
                columns = [d.name for d in cursor.description or ()][:-2]
                rows: list[list[Any]] = []
                truncated, left = False, budget
                for *values, _own, total in cursor.fetchall():
                    if len(rows) == max_rows or (rows and total > budget):  # `total` counts from this statement
                        truncated = True
                        break
                    rows.append(values)
                    left = budget - total
                budget = left
                results.append(Rows(columns, rows, truncated=truncated))
        return results

    def write(self, statements: Sequence[str], timeout_ms: int, *, commit: bool) -> WriteOutcome:
        outcome = WriteOutcome(row_counts=[])
        with self._connect(read_only=False, timeout_ms=timeout_ms) as db:
            for statement in statements:
                cursor = db.execute(statement)
                if cursor.description:
                    returned = cursor.fetchall()
                    outcome.returned.append(Rows([d.name for d in cursor.description], [list(r) for r in returned]))
                ddl = cursor.statusmessage is not None and cursor.statusmessage.split()[0] in (
                    "CREATE",
                    "DROP",
                    "ALTER",
                )
                outcome.row_counts.append(None if ddl or cursor.rowcount < 0 else cursor.rowcount)
            if commit:
                db.commit()
        return outcome

    def insert(
        self, table: str, records: Sequence[Mapping[str, Any]], returning: str | None, timeout_ms: int
    ) -> list[Any]:
        ids: list[Any] = []
        with self._connect(read_only=False, timeout_ms=timeout_ms) as db:
            for record in records:
                columns = ", ".join(_quote(c) for c in record)
                marks = ", ".join("%s" for _ in record)
                values = f"({columns}) VALUES ({marks})" if record else "DEFAULT VALUES"
                back = f" RETURNING {_quote(returning)}" if returning else ""
                row = db.execute(f"INSERT INTO {_quote(table)} {values}{back}", tuple(record.values())).fetchone()  # type: ignore[arg-type]
                ids.append(row[0] if returning and row else None)
            db.commit()
        return ids
