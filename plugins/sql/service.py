"""What the SQL tools do, apart from MCP: limits, the schema cache, dry runs, tokens, inserts.

The MCP layer (`plugins/sql/__init__.py`) only parses arguments and wraps results.
Every database call runs in a worker thread (`interrupt.run_interruptible`), never on
the event loop; a statement's own time limit stops it inside the database, and so does
cancelling its call (a client that hung up).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.sizes import surrogate_refusal

from .database import Database
from .interrupt import run_interruptible
from .records import find_table, prepare_records
from .results import ExecuteResult, InsertResult, StatementEffect, pipe_table, result_set
from .schema import Schema
from .tokens import SharedTokenStore, TokenStore

if TYPE_CHECKING:
    from .classify import Classified

__all__ = ["Limits", "SqlRefusal", "SqlService"]


class SqlRefusal(ValueError):
    """A request the service will not carry out; the message says why and what to do instead."""


@dataclass(frozen=True)
class Limits:
    timeout_ms: int
    timeout_ms_limit: int
    max_rows: int
    max_rows_limit: int

    def timeout(self, requested: int | None) -> int:
        return _within("timeout_ms", requested, self.timeout_ms, self.timeout_ms_limit)

    def rows(self, requested: int | None) -> int:
        return _within("max_rows", requested, self.max_rows, self.max_rows_limit)


def _within(name: str, requested: int | None, default: int, limit: int) -> int:
    """`requested`, or `default` when it is None; refused outside 1..`limit`."""
    if requested is None:
        return default
    if not 1 <= requested <= limit:
        raise SqlRefusal(f"{name} must be between 1 and {limit} (the configured maximum)")
    return requested


class _ContextFile:
    """The optional Markdown context file, re-read when its modification time changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._seen: tuple[float, str] | None = None

    def text(self) -> str:
        if self.path is None:
            return ""
        try:
            mtime = self.path.stat().st_mtime
        except FileNotFoundError:
            return ""
        if self._seen is None or self._seen[0] != mtime:
            self._seen = (mtime, self.path.read_text(encoding="utf-8"))
        return self._seen[1]


class SqlService:
    def __init__(
        self,
        database: Database,
        limits: Limits,
        *,
        token_lifetime_s: float,
        context_file: Path | None = None,
        clock: Callable[[], float] | None = None,
        tokens_url: str | None = None,
    ) -> None:
        """`tokens_url`: the deployment's PostgreSQL database, so a dry run's token works on every replica."""
        self.database = database
        self.limits = limits
        self.tokens: TokenStore = (
            SharedTokenStore(tokens_url, token_lifetime_s, clock or time.time)
            if tokens_url
            else TokenStore(token_lifetime_s, clock or time.time)
        )
        self.context = _ContextFile(context_file)
        self._schema: Schema | None = None
        self._schema_lock = threading.Lock()

    @property
    def dialect_name(self) -> str:
        return "PostgreSQL" if self.database.backend == "postgresql" else "SQLite"

    def classify(self, sql: str) -> Classified:
        from .classify import classify  # sqlglot loads with the first statement, not with the gateway

        return classify(sql, self.database.backend)

    # --- schema -----------------------------------------------------------------------------

    def _read_schema(self, refresh: bool) -> Schema:
        with self._schema_lock:
            if self._schema is None or refresh:
                self._schema = self.database.read_schema()
            return self._schema

    async def schema(self, refresh: bool = False) -> Schema:
        """The cached schema, read on first use and again when `refresh` is set or a DDL statement ran."""
        return await run_interruptible(self._read_schema, refresh)

    # --- execute_sql ------------------------------------------------------------------------

    async def execute(
        self,
        sql: str,
        *,
        dry_run: bool,
        confirmation_token: str | None,
        timeout_ms: int | None,
        max_rows: int | None,
    ) -> tuple[str, ExecuteResult]:
        timeout = self.limits.timeout(timeout_ms)
        rows = self.limits.rows(max_rows)
        if (refusal := surrogate_refusal("sql", sql)) is not None:
            raise SqlRefusal(refusal)  # neither database driver can send it (UTF-8)
        classified = self.classify(sql)
        if classified.is_read:
            return await self._read(classified, dry_run=dry_run, timeout=timeout, max_rows=rows)
        if self.database.read_only:
            raise SqlRefusal(
                f"the database is configured read_only: writes are refused ({classified.summary}); only queries can run"
            )
        if dry_run:
            return await self._dry_run_write(classified, timeout)
        if not confirmation_token:
            raise SqlRefusal(
                f"a write ({classified.summary}) needs confirmation_token: run execute_sql with dry_run=true "
                "first, check what would change, then call again with dry_run=false and the token it returns"
            )
        self.tokens.redeem(confirmation_token, classified.digest)
        outcome = await run_interruptible(
            lambda: self.database.write([s.sql for s in classified.statements], timeout, commit=True)
        )
        effects = self._effects(classified, outcome.row_counts)
        if any(s.kind == "ddl" for s in classified.statements):
            self._schema = None
        result = ExecuteResult(
            kind="write",
            dry_run=False,
            executed=True,
            effects=effects,
            total_changes=outcome.total_changes,
            note="Committed.",
        )
        return "Committed. " + self._effects_text(effects, outcome.total_changes), result

    async def _read(
        self, classified: Classified, *, dry_run: bool, timeout: int, max_rows: int
    ) -> tuple[str, ExecuteResult]:
        statements = [s.sql for s in classified.statements]
        if dry_run:
            plans = [await run_interruptible(self.database.explain, s, timeout) for s in statements]
            sets = [result_set(s, plan) for s, plan in zip(statements, plans, strict=True)]
            note = "Dry run: the query plan only. Call again with dry_run=false to get the rows."
            text = [note] + [f"Plan of: {s.statement}\n{pipe_table(s.columns, s.rows)}" for s in sets]
            return "\n\n".join(text), ExecuteResult(kind="read", dry_run=True, executed=False, results=sets, note=note)
        fetched = await run_interruptible(self.database.query, statements, timeout, max_rows)
        sets = [result_set(s, r) for s, r in zip(statements, fetched, strict=True)]
        parts = []
        for result in sets:
            count = f"{result.row_count} row{'s' if result.row_count != 1 else ''}"
            if result.truncated:
                count += f" shown; more rows exist (cut at max_rows={max_rows} or max_value_bytes: add a LIMIT)"
            header = f"{count}:" if len(sets) == 1 else f"{result.statement}\n{count}:"
            parts.append(f"{header}\n{pipe_table(result.columns, result.rows)}".rstrip())
        note = "Some results were cut at max_rows." if any(s.truncated for s in sets) else ""
        return "\n\n".join(parts), ExecuteResult(kind="read", dry_run=False, executed=True, results=sets, note=note)

    async def _dry_run_write(self, classified: Classified, timeout: int) -> tuple[str, ExecuteResult]:
        # Run for real inside a transaction, then roll back: the counts are exact, including
        # upserts, triggers and cascades, and constraint errors show up before anything is kept.
        outcome = await run_interruptible(
            lambda: self.database.write([s.sql for s in classified.statements], timeout, commit=False)
        )
        effects = self._effects(classified, outcome.row_counts)
        token, expires = self.tokens.issue(classified.digest, classified.summary)
        expires_at = datetime.fromtimestamp(expires, UTC)
        note = (
            "Dry run: the statements ran in a transaction that was rolled back; nothing changed. To apply them, "
            f"call execute_sql again with the same sql, dry_run=false and confirmation_token={token!r} "
            f"(single use, valid until {expires_at.isoformat(timespec='seconds')})."
        )
        result = ExecuteResult(
            kind="write",
            dry_run=True,
            executed=False,
            effects=effects,
            total_changes=outcome.total_changes,
            confirmation_token=token,
            token_expires_at=expires_at,
            note=note,
        )
        return self._effects_text(effects, outcome.total_changes) + "\n\n" + note, result

    @staticmethod
    def _effects(classified: Classified, counts: Sequence[int | None]) -> list[StatementEffect]:
        return [
            StatementEffect(
                statement=s.sql,
                kind="ddl" if s.kind == "ddl" else "write",
                label=s.label,
                target=s.target,
                rows_affected=count,
            )
            for s, count in zip(classified.statements, counts, strict=True)
        ]

    @staticmethod
    def _effects_text(effects: Sequence[StatementEffect], total_changes: int | None) -> str:
        lines = []
        for effect in effects:
            target = f" on {effect.target}" if effect.target else ""
            rows = "" if effect.rows_affected is None else f": {effect.rows_affected} row(s)"
            lines.append(f"- {effect.label}{target}{rows}")
        counted = sum(e.rows_affected or 0 for e in effects)
        if total_changes is not None and total_changes != counted:
            lines.append(f"- {total_changes} row(s) changed in all, counting triggers and foreign-key actions")
        return "\n".join(lines)

    # --- add_records ------------------------------------------------------------------------

    async def add_records(self, table_name: str, records: Sequence[Mapping[str, Any]]) -> tuple[str, InsertResult]:
        if self.database.read_only:
            raise SqlRefusal("the database is configured read_only: add_records is refused")
        for index, record in enumerate(records):
            for column, value in record.items():
                name = f"records[{index}].{column}"
                for text, what in ((column, f"the column name {name}"), (value, name)):
                    if isinstance(text, str) and (refusal := surrogate_refusal(what, text)) is not None:
                        raise SqlRefusal(refusal)
        schema = await self.schema()
        table = find_table(schema, table_name)
        prepared = prepare_records(table, records)
        id_column = table.primary_key[0] if len(table.primary_key) == 1 else None
        timeout = self.limits.timeout_ms
        ids = await run_interruptible(lambda: self.database.insert(table.name, prepared, id_column, timeout))
        result = InsertResult(table=table.name, inserted=len(ids), ids=ids, id_column=id_column)
        shown = f"; new {id_column}: {', '.join(str(i) for i in ids[:50])}" if id_column else ""
        return f"Inserted {len(ids)} row(s) into {table.name}{shown}.", result
