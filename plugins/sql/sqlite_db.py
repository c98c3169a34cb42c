"""SQLite through the standard library's sqlite3, one connection per call.

Time limits use a progress handler: SQLite calls it every few thousand virtual-machine
instructions, including while rows are fetched, and a non-zero return interrupts the
statement. The same handler, and `Connection.interrupt`, stop the statement of a call that was
cancelled (`interrupt.py`). Reads open the file with `mode=ro`, so they cannot write whatever they call.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

from .database import DatabaseError, QueryTimeout, Rows, WriteOutcome
from .interrupt import Interrupt, QueryInterrupted, interruptible
from .schema import Column, ForeignKey, Index, Schema, Table

__all__ = ["SqliteDatabase"]

_PROGRESS_STEPS = 1000
"""Virtual-machine instructions between two looks at the clock: about a few microseconds of work."""


def _stopper(deadline: float, interrupt: Interrupt | None) -> Callable[[], int]:
    """The progress handler: non-zero (stop) past the deadline or once the call's interrupt fired (which
    also catches a statement that started just after `Connection.interrupt`, which only stops running ones)."""
    if interrupt is None:
        return lambda: int(time.monotonic() > deadline)
    return lambda: int(interrupt.fired or time.monotonic() > deadline)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class SqliteDatabase:
    backend: Literal["sqlite"] = "sqlite"

    def __init__(self, path: Path, *, read_only: bool, max_value_bytes: int = 1 << 20) -> None:
        self.path = path
        self.read_only = read_only
        self.label = str(path)
        self.max_value_bytes = max_value_bytes
        """Longest string or blob a statement may build or read, and most bytes of values one call returns."""

    @contextmanager
    def _connect(self, *, writable: bool, timeout_ms: int) -> Iterator[sqlite3.Connection]:
        if not self.path.is_file():
            raise DatabaseError(f"the SQLite database file {self.path} does not exist")
        mode = "rw" if writable and not self.read_only else "ro"
        uri = f"file:{quote(str(self.path.resolve()))}?mode={mode}"
        try:
            connection = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=min(timeout_ms / 1000, 5.0))
        except sqlite3.Error as error:
            raise DatabaseError(f"cannot open the SQLite database {self.path}: {error}") from None
        deadline = time.monotonic() + timeout_ms / 1000
        interrupt: Interrupt | None = None
        try:
            # A cancelled call stops its statement at once (`interrupt.py`), its time limit at the deadline.
            with interruptible(connection.interrupt) as interrupt:
                connection.set_progress_handler(_stopper(deadline, interrupt), _PROGRESS_STEPS)
                # A value is bounded as SQLite builds it (zeroblob(200000000) fails at once), not after the fact.
                connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.max_value_bytes)
                connection.execute("PRAGMA foreign_keys = ON")
                yield connection
        except sqlite3.DataError as error:
            if "too big" in str(error):
                raise DatabaseError(
                    f"a value longer than {self.max_value_bytes} bytes (max_value_bytes) was built or read; "
                    "select a part of it (substr, length) instead"
                ) from None
            raise DatabaseError(str(error)) from None
        except sqlite3.OperationalError as error:
            if str(error) == "interrupted":
                if interrupt is not None and interrupt.fired:
                    raise QueryInterrupted("the statement was stopped: its call was cancelled") from None
                raise QueryTimeout(f"the statement was stopped after its time limit of {timeout_ms} ms") from None
            raise DatabaseError(str(error)) from None
        except sqlite3.Error as error:
            raise DatabaseError(str(error)) from None
        finally:
            connection.close()

    def read_schema(self) -> Schema:
        with self._connect(writable=False, timeout_ms=10_000) as db:
            objects = db.execute(
                "SELECT type, name, sql FROM sqlite_schema WHERE type IN ('table', 'view') "
                "AND name NOT LIKE 'sqlite_%' ORDER BY name"
            ).fetchall()
            tables = [self._table(db, kind, name, sql) for kind, name, sql in objects]
        return Schema(backend="sqlite", database=self.label, read_at=datetime.now(UTC), tables=tables)

    def _table(self, db: sqlite3.Connection, kind: str, name: str, sql: str | None) -> Table:
        info = db.execute(f"PRAGMA table_xinfo({_quote(name)})").fetchall()
        visible = [row for row in info if row[6] in (0, 2, 3)]  # 1 marks a hidden column of a virtual table
        pk = [row[1] for row in sorted((r for r in visible if r[5]), key=lambda r: r[5])]
        rowid_alias = len(pk) == 1 and any(r[1] == pk[0] and r[2].upper() == "INTEGER" for r in visible)
        columns = [
            Column(
                name=row[1],
                type=row[2],
                nullable=not row[3] and not (row[5] and rowid_alias),
                default=row[4],
                primary_key=bool(row[5]),
                auto_increment=bool(row[5]) and rowid_alias,
            )
            for row in visible
        ]
        foreign_keys: dict[int, ForeignKey] = {}
        for fk_id, _seq, target, source, to, on_update, on_delete, _match in db.execute(
            f"PRAGMA foreign_key_list({_quote(name)})"
        ):
            fk = foreign_keys.setdefault(
                fk_id,
                ForeignKey(
                    columns=[], references_table=target, references_columns=[], on_delete=on_delete, on_update=on_update
                ),
            )
            fk.columns.append(source)
            fk.references_columns.append(to or "")
        indexes = []
        ddl = [sql] if sql else []
        for _seq, index_name, unique, origin, _partial in db.execute(f"PRAGMA index_list({_quote(name)})"):
            columns_of = [r[2] for r in db.execute(f"PRAGMA index_info({_quote(index_name)})") if r[2] is not None]
            indexes.append(Index(name=index_name, columns=columns_of, unique=bool(unique)))
            if origin == "c":
                row = db.execute(
                    "SELECT sql FROM sqlite_schema WHERE type = 'index' AND name = ?", (index_name,)
                ).fetchone()
                if row and row[0]:
                    ddl.append(row[0])
        return Table(
            name=name,
            kind="view" if kind == "view" else "table",
            columns=columns,
            primary_key=pk,
            foreign_keys=list(foreign_keys.values()),
            indexes=indexes,
            ddl=";\n".join(ddl) or None,
        )

    def explain(self, sql: str, timeout_ms: int) -> Rows:
        with self._connect(writable=False, timeout_ms=timeout_ms) as db:
            cursor = db.execute("EXPLAIN QUERY PLAN " + sql)
            rows = cursor.fetchall()
        return Rows(columns=["id", "parent", "detail"], rows=[[r[0], r[1], r[3]] for r in rows])

    def query(self, statements: Sequence[str], timeout_ms: int, max_rows: int) -> list[Rows]:
        results = []
        budget = self.max_value_bytes
        with self._connect(writable=False, timeout_ms=timeout_ms) as db:
            for statement in statements:
                cursor = db.execute(statement)
                columns = [d[0] for d in cursor.description or ()]
                rows: list[list[Any]] = []
                truncated = False
                for row in cursor:  # row by row: the bytes returned are bounded while reading
                    size = sum(_json_size(value) for value in row)
                    if len(rows) == max_rows or (rows and size > budget):
                        truncated = True
                        break
                    budget -= size
                    rows.append(list(row))
                results.append(Rows(columns, rows, truncated=truncated))
        return results

    def write(self, statements: Sequence[str], timeout_ms: int, *, commit: bool) -> WriteOutcome:
        with self._connect(writable=True, timeout_ms=timeout_ms) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                before = db.total_changes
                outcome = WriteOutcome(row_counts=[])
                for statement in statements:
                    cursor = db.execute(statement)
                    if cursor.description:
                        returned = cursor.fetchall()
                        outcome.returned.append(Rows([d[0] for d in cursor.description], [list(r) for r in returned]))
                    outcome.row_counts.append(cursor.rowcount if cursor.rowcount >= 0 else None)
                outcome.total_changes = db.total_changes - before
                db.execute("COMMIT" if commit else "ROLLBACK")
            except BaseException:
                _roll_back(db)
                raise
        return outcome

    def insert(
        self, table: str, records: Sequence[Mapping[str, Any]], returning: str | None, timeout_ms: int
    ) -> list[Any]:
        ids: list[Any] = []
        with self._connect(writable=True, timeout_ms=timeout_ms) as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                for record in records:
                    columns = ", ".join(_quote(c) for c in record)
                    marks = ", ".join("?" for _ in record)
                    values = f"({columns}) VALUES ({marks})" if record else "DEFAULT VALUES"
                    back = f" RETURNING {_quote(returning)}" if returning else ""
                    row = db.execute(f"INSERT INTO {_quote(table)} {values}{back}", tuple(record.values())).fetchone()
                    ids.append(row[0] if returning and row else None)
                db.execute("COMMIT")
            except BaseException:
                _roll_back(db)
                raise
        return ids


def _json_size(value: Any) -> int:
    """About the bytes a value takes in the result's JSON (a blob as base64: `database.json_value`)."""
    if isinstance(value, bytes):
        return len(value) * 4 // 3 + 10
    return len(value) if isinstance(value, str) else 8


def _roll_back(db: sqlite3.Connection) -> None:
    """Undo an open transaction, even one whose statement was just interrupted for its time limit."""
    db.set_progress_handler(None, 0)
    if db.in_transaction:
        db.execute("ROLLBACK")


def create_file(path: Path, script: str) -> None:
    """Create a SQLite file from a script, atomically: a half-built file never takes the name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    with closing(sqlite3.connect(partial)) as db:
        db.executescript(f"BEGIN;\n{script}\nCOMMIT;")  # one transaction: one sync to disk, not one per row
    partial.replace(path)
