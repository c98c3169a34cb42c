"""What a piece of SQL is, decided by a real parser (sqlglot), and whether the plugin runs it.

Regular expressions cannot tell `SELECT ';'` from `SELECT 1; DROP TABLE t`, nor a
comment from code; a parser can. Every statement of the input is parsed and put in one
of these kinds:

| kind        | statements                                                        | policy |
| ----------- | ----------------------------------------------------------------- | ------ |
| read        | SELECT / UNION / VALUES / WITH … SELECT, safe PRAGMA reads         | runs; a dry run shows the plan |
| write       | INSERT, UPDATE, DELETE, REPLACE, upsert, MERGE, a CTE that writes | needs a dry run's token |
| ddl         | CREATE, DROP, ALTER, TRUNCATE                                     | a write: needs a token |
| pragma      | any other PRAGMA (`PRAGMA x = y`, unknown pragmas)                | refused |
| transaction | BEGIN, COMMIT, ROLLBACK, SAVEPOINT, RELEASE                       | refused: the tool owns them |
| other       | ATTACH, DETACH, SET, COPY, GRANT, VACUUM, EXPLAIN, anything else  | refused |

Several statements in one call ("stacked") are allowed when all are reads (each
result is returned), or when none is a read and all are writes or DDL: the script
is then dry-run and confirmed as one unit and executed atomically in one
transaction. Any refused statement refuses the whole input.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from .refused import SqlRefused

__all__ = [
    "QUERY_PRAGMAS",
    "SAFE_PRAGMAS",
    "SETTING_PRAGMAS",
    "Classified",
    "SqlRefused",
    "Statement",
    "classify",
    "dialect_of",
]

Kind = Literal["read", "write", "ddl", "pragma", "transaction", "other"]
Backend = Literal["sqlite", "postgresql"]

QUERY_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
        "foreign_key_check",
        "integrity_check",
        "quick_check",
    }
)
"""PRAGMAs that only report, with or without an argument (`PRAGMA table_info(customers)`)."""

SETTING_PRAGMAS = frozenset(
    {
        "collation_list",
        "compile_options",
        "database_list",
        "function_list",
        "page_count",
        "page_size",
        "freelist_count",
        "user_version",
        "schema_version",
        "encoding",
        "foreign_keys",
        "journal_mode",
        "application_id",
    }
)
"""PRAGMAs that read a setting when given no argument, and change it when given one (refused)."""

SAFE_PRAGMAS = QUERY_PRAGMAS | SETTING_PRAGMAS

_WRITES = (exp.Insert, exp.Update, exp.Delete, exp.Merge)
_DDL = (exp.Create, exp.Drop, exp.Alter, exp.TruncateTable)
_TRANSACTION = (exp.Transaction, exp.Commit, exp.Rollback)
_TRANSACTION_WORDS = {"BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE", "START", "ABORT"}

# sqlglot logs a warning when it falls back to an opaque `Command`; the plugin reports that itself.
logging.getLogger("sqlglot").setLevel(logging.ERROR)


@dataclass(frozen=True)
class Statement:
    """One parsed statement: its kind, the table it changes (writes and DDL), its normalized text."""

    kind: Kind
    sql: str
    target: str | None
    label: str
    """What it is, in words: 'SELECT', 'INSERT', 'PRAGMA table_info', 'CREATE TABLE'..."""


@dataclass(frozen=True)
class Classified:
    """The whole input: its statements and what the plugin does with them."""

    statements: tuple[Statement, ...]

    @property
    def is_read(self) -> bool:
        return all(s.kind == "read" for s in self.statements)

    @property
    def normalized(self) -> str:
        """One canonical text for the input: what a confirmation token is bound to."""
        return ";\n".join(s.sql for s in self.statements)

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.normalized.encode()).hexdigest()

    @property
    def summary(self) -> str:
        return ", ".join(s.label + (f" {s.target}" if s.target else "") for s in self.statements)


def dialect_of(backend: Backend) -> str:
    return "postgres" if backend == "postgresql" else "sqlite"


def _parse(sql: str, dialect: str) -> list[exp.Expr]:
    try:
        parsed = sqlglot.parse(sql, read=dialect)
    except ParseError as error:
        raise SqlRefused(f"the SQL could not be parsed: {_parse_error(error)}") from None
    except TokenError as error:
        raise SqlRefused(f"the SQL could not be parsed: {error}") from None
    # A comment after the last ';' parses as an empty `Semicolon` statement.
    return [e for e in parsed if e is not None and not isinstance(e, exp.Semicolon)]


def _parse_error(error: ParseError) -> str:
    """sqlglot's first error in plain words: no token reprs, no terminal colour codes."""
    if not error.errors:
        return str(error).splitlines()[0]
    first = error.errors[0]
    description = re.sub(r"<Token token_type: [^,]+, text: ([^,]*),.*?>", r"'\1'", str(first.get("description")))
    return f"{description} (line {first.get('line')}, column {first.get('col')})"


def _table_name(node: exp.Expr | None) -> str | None:
    table = node.find(exp.Table) if node is not None and not isinstance(node, exp.Table) else node
    if not isinstance(table, exp.Table):
        return None
    return ".".join(part for part in (table.db, table.name) if part) or None


def _pragma(expression: exp.Pragma, dialect: str) -> Statement:
    # sqlglot reads `PRAGMA x(arg)` and `PRAGMA x = arg` alike, as SQLite itself does.
    inner = expression.this
    text = expression.sql(dialect=dialect)
    has_argument = isinstance(inner, exp.EQ)
    target = inner.this if has_argument else inner
    name = target.sql(dialect=dialect).split(".")[-1].lower()
    if dialect != "sqlite":
        return Statement("other", text, None, "PRAGMA")
    if name in QUERY_PRAGMAS or (name in SETTING_PRAGMAS and not has_argument):
        return Statement("read", text, None, f"PRAGMA {name}")
    return Statement("pragma", text, None, f"PRAGMA {name}" + (" with a value" if has_argument else ""))


def _command(expression: exp.Command, dialect: str, sql: str) -> Statement:
    word = str(expression.this).upper()
    text = expression.sql(dialect=dialect)
    if word == "REPLACE" and dialect == "sqlite":
        # SQLite's REPLACE is INSERT OR REPLACE; sqlglot reads only the long form.
        rewritten = _parse("INSERT OR " + text, dialect)
        if len(rewritten) == 1 and isinstance(rewritten[0], exp.Insert):
            return Statement("write", text, _table_name(rewritten[0].this), "REPLACE")
    if word in _TRANSACTION_WORDS:
        return Statement("transaction", text, None, word)
    return Statement("other", text, None, word)


def _statement(expression: exp.Expr, dialect: str) -> Statement:
    text = expression.sql(dialect=dialect)
    if isinstance(expression, exp.Pragma):
        return _pragma(expression, dialect)
    if isinstance(expression, exp.Command):
        return _command(expression, dialect, text)
    if isinstance(expression, _WRITES):
        label = type(expression).__name__.upper()
        if isinstance(expression, exp.Insert) and expression.args.get("conflict") is not None:
            label = "UPSERT"
        return Statement("write", text, _table_name(expression.this), label)
    if isinstance(expression, _DDL):
        kind_word = str(expression.args.get("kind") or "").upper()
        label = f"{type(expression).__name__.upper()} {kind_word}".strip()
        if isinstance(expression, exp.TruncateTable):
            label = "TRUNCATE"
        return Statement("ddl", text, _table_name(expression), label)
    if isinstance(expression, _TRANSACTION):
        return Statement("transaction", text, None, type(expression).__name__.upper())
    if isinstance(expression, exp.Query | exp.Values):
        inner_write = next(iter(expression.find_all(*_WRITES)), None)
        if inner_write is not None:
            # `WITH gone AS (DELETE FROM t RETURNING *) SELECT * FROM gone` writes.
            return Statement(
                "write", text, _table_name(inner_write.this), f"{type(inner_write).__name__.upper()} (in a CTE)"
            )
        return Statement("read", text, None, "SELECT")
    if isinstance(expression, exp.Alias) and expression.alias:
        # sqlglot reads `SAVEPOINT a` / `RELEASE a` as a column alias.
        word = expression.this.sql(dialect=dialect).upper()
        if word in _TRANSACTION_WORDS:
            return Statement("transaction", text, None, word)
    return Statement("other", text, None, type(expression).__name__.upper())


_REFUSALS: dict[Kind, str] = {
    "pragma": "only PRAGMAs that report are allowed: {queries} (with an argument), and {settings} "
    "(read only: no argument or '= value')",
    "transaction": "transaction control is not allowed: the tool runs each call in its own transaction "
    "(a multi-statement write runs atomically under one confirmation token)",
    "other": "only queries, INSERT/UPDATE/DELETE/REPLACE/upserts and CREATE/DROP/ALTER/TRUNCATE are allowed "
    "(ATTACH, DETACH, SET, COPY, GRANT, VACUUM, EXPLAIN and the like are refused; use dry_run to see a plan)",
}


def classify(sql: str, backend: Backend) -> Classified:
    """Parse `sql` and apply the policy in the module docstring; raises `SqlRefused` with the reason."""
    if not sql.strip():
        raise SqlRefused("sql is empty; give one SQL statement such as 'SELECT * FROM customers LIMIT 5'")
    statements = tuple(_statement(e, dialect_of(backend)) for e in _parse(sql, dialect_of(backend)))
    if not statements:
        raise SqlRefused("sql holds no statement (only comments or ';')")
    for number, statement in enumerate(statements, start=1):
        if statement.kind in _REFUSALS:
            where = f"statement {number} ({statement.label})" if len(statements) > 1 else statement.label
            reason = _REFUSALS[statement.kind].format(
                queries=", ".join(sorted(QUERY_PRAGMAS)), settings=", ".join(sorted(SETTING_PRAGMAS))
            )
            raise SqlRefused(f"{where} is refused: {reason}")
    kinds = {s.kind for s in statements}
    if len(statements) > 1 and "read" in kinds and kinds != {"read"}:
        raise SqlRefused(
            f"{len(statements)} statements mix reads and writes ({Classified(statements).summary}); "
            "send the reads and the writes in separate calls"
        )
    return Classified(statements)
