"""SQL: describe, query and change a SQLite or PostgreSQL database, with safety rails.

Reads run on connections that cannot write. A write (or DDL) runs only after a dry run
has shown what it would change and issued a single-use, expiring confirmation token
bound to that exact statement; `read_only: true` refuses writes outright. Statements
are classified by a SQL parser (see `classify.py` for the policy), every statement has
a time limit that stops it inside the database, and `generate_sql` asks the client's
own model for SQL through MCP sampling, so no API key lives in the gateway.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.config.settings import Settings
from gateway.hookspecs import RegisterServer, hookimpl

from .database import Database, DatabaseError
from .demo import create_demo_database
from .generate import add_generate_sql
from .postgres_db import PostgresDatabase
from .records import RecordsInvalid
from .refused import SqlRefused
from .results import ExecuteResult, InsertResult
from .schema import Schema, SchemaFormat, render_schema
from .service import Limits, SqlRefusal, SqlService
from .sqlite_db import SqliteDatabase
from .tokens import TokenRefused

__all__ = ["Config", "create_server", "gateway_register_servers", "open_database"]

DEMO_FILE = "sql/demo.sqlite"
READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True, destructive_hint=False, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=False, open_world_hint=False)
ADDS = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False, open_world_hint=False)
_POSTGRES_SCHEMES = ("postgresql", "postgres")


class Config(BaseModel):
    """`plugins: {sql: {...}}` in the YAML file."""

    model_config = ConfigDict(extra="forbid")

    database: str | None = Field(
        default=None,
        description="A SQLite file path (relative paths are resolved against the gateway's data directory) or a "
        "postgresql:// URL without a password. Unset: the demo shop database at <data_dir>/sql/demo.sqlite.",
    )
    demo: bool = Field(
        default=False, description="Create the demo shop database at `database` when that file does not exist."
    )
    password_env: str | None = Field(
        default=None, description="PostgreSQL: the environment variable that holds the password."
    )
    read_only: bool = Field(default=False, description="Refuse every write; SQLite files are opened read-only.")
    timeout_ms: int = Field(default=5_000, ge=1, description="Time limit of a statement when the call gives none.")
    timeout_ms_limit: int = Field(default=60_000, ge=1, description="Largest timeout_ms a call may ask for.")
    max_rows: int = Field(default=100, ge=1, description="Rows returned when the call gives no max_rows.")
    max_rows_limit: int = Field(default=1_000, ge=1, description="Largest max_rows a call may ask for.")
    max_value_bytes: int = Field(
        default=1 << 20,
        ge=1_000,
        le=1 << 30,
        description="The longest value a read may return (SQLite: a string or blob, refused as SQLite builds it; "
        "PostgreSQL: a row, refused by the server before it is sent), and the most bytes of values one "
        "call returns (rows past it are cut, as at max_rows).",
    )
    token_lifetime_s: float = Field(default=300, gt=0, description="How long a confirmation token stays valid.")
    context_file: str | None = Field(
        default=None,
        description="Markdown notes about the database for generate_sql's prompt (relative to the data "
        "directory); re-read when it changes.",
    )
    max_retries: int = Field(default=2, ge=0, le=10, description="generate_sql's extra attempts after invalid SQL.")

    @model_validator(mode="after")
    def _check(self) -> Config:
        if self.timeout_ms > self.timeout_ms_limit:
            raise ValueError(f"timeout_ms ({self.timeout_ms}) is above timeout_ms_limit ({self.timeout_ms_limit})")
        if self.max_rows > self.max_rows_limit:
            raise ValueError(f"max_rows ({self.max_rows}) is above max_rows_limit ({self.max_rows_limit})")
        if self.database and "://" in self.database:
            parts = urlsplit(self.database)
            if parts.scheme not in _POSTGRES_SCHEMES:
                raise ValueError(f"database URL scheme {parts.scheme!r} is not supported; use postgresql:// or a file")
            if parts.password is not None:
                raise ValueError(
                    "database URL contains a password; remove it and name the environment variable that holds "
                    "it in password_env"
                )
            if self.demo:
                raise ValueError("demo creates a SQLite file; it cannot be used with a postgresql:// database")
        return self


def open_database(config: Config, data_dir: Path) -> Database:
    """The configured database; the demo is created first when it is asked for and missing."""
    database = config.database
    if database and urlsplit(database).scheme in _POSTGRES_SCHEMES:
        return PostgresDatabase(
            database,
            password_env=config.password_env,
            read_only=config.read_only,
            max_value_bytes=config.max_value_bytes,
        )
    path = Path(database).expanduser() if database else Path(DEMO_FILE)
    if not path.is_absolute():
        path = data_dir / path
    if config.demo or not database:
        create_demo_database(path)
    return SqliteDatabase(path, read_only=config.read_only, max_value_bytes=config.max_value_bytes)


def _result(text: str, model: BaseModel) -> CallToolResult:
    return CallToolResult(
        content=[TextContent(type="text", text=text)], structured_content=model.model_dump(mode="json")
    )


_REFUSALS = (SqlRefused, SqlRefusal, TokenRefused, RecordsInvalid, DatabaseError)


def create_server(
    config: Config,
    data_dir: Path,
    *,
    database: Database | None = None,
    clock: Callable[[], float] | None = None,
    tokens_url: str | None = None,
) -> MCPServer:
    """Build the `sql` server; the gateway and the tests use the same object. `clock` is for tests;
    `tokens_url` (the deployment's PostgreSQL) shares dry-run tokens between replicas."""
    database = database or open_database(config, data_dir)
    context_file = None
    if config.context_file:
        context_file = Path(config.context_file).expanduser()
        context_file = context_file if context_file.is_absolute() else data_dir / context_file
    service = SqlService(
        database,
        Limits(config.timeout_ms, config.timeout_ms_limit, config.max_rows, config.max_rows_limit),
        token_lifetime_s=config.token_lifetime_s,
        context_file=context_file,
        tokens_url=tokens_url,
        clock=clock,
    )
    mode = "read-only" if config.read_only else "read-write (writes need a dry run's confirmation token)"
    server = MCPServer(
        "sql",
        instructions=(
            f"A {service.dialect_name} database, {mode}. Start with describe_schema. execute_sql dry-runs by "
            "default: a query shows its plan, a write shows what would change and returns a confirmation_token; "
            "call again with dry_run=false (and the token, for a write) to run it."
        ),
    )

    @server.tool(annotations=READ_ONLY)
    async def describe_schema(
        format: Annotated[
            SchemaFormat, Field(description="markdown (tables per table), json, or sql (CREATE statements).")
        ] = "markdown",
        refresh: Annotated[bool, Field(description="Read the schema again instead of using the cached one.")] = False,
    ) -> Annotated[CallToolResult, Schema]:
        """The database's tables and views: columns with types, nullability and defaults, primary keys,
        foreign keys (relationships) and indexes. Cached; the result says when it was read."""
        try:
            schema = await service.schema(refresh)
        except DatabaseError as error:
            raise ToolError(str(error)) from None
        return _result(render_schema(schema, format), schema)

    @server.tool(annotations=WRITES)
    async def execute_sql(
        sql: Annotated[str, Field(description="The SQL. Several statements only if all are reads, or all writes.")],
        dry_run: Annotated[
            bool, Field(description="True (default): show the plan, or what a write would change plus a token.")
        ] = True,
        confirmation_token: Annotated[
            str | None, Field(description="From the dry run of this exact statement; needed to run a write.")
        ] = None,
        timeout_ms: Annotated[
            int | None, Field(description="Time limit in ms; the config sets the default and the maximum.")
        ] = None,
        max_rows: Annotated[
            int | None, Field(description="Most rows to return; the config sets the default and the maximum.")
        ] = None,
    ) -> Annotated[CallToolResult, ExecuteResult]:
        """Run SQL on the database safely, to answer questions from its data (how many, totals, averages, per
        group, top N, lookups) or to change it. Queries:
        dry_run=true gives the plan, dry_run=false the rows as a table. Writes and DDL: dry_run=true runs
        them in a rolled-back transaction to count the rows they would change and returns a single-use
        confirmation_token; dry_run=false with that token runs them in one transaction."""
        try:
            text, result = await service.execute(
                sql, dry_run=dry_run, confirmation_token=confirmation_token, timeout_ms=timeout_ms, max_rows=max_rows
            )
        except _REFUSALS as error:
            raise ToolError(str(error)) from None
        return _result(text, result)

    @server.tool(annotations=ADDS)
    async def add_records(
        table: Annotated[str, Field(description="The table to insert into.")],
        records: Annotated[
            list[dict[str, Any]], Field(description="Rows as objects of column → value; all inserted or none.")
        ],
    ) -> Annotated[CallToolResult, InsertResult]:
        """Insert rows into a table in one transaction, after checking every field name, type and required
        column against the schema. Reports the number inserted and their new ids."""
        try:
            text, result = await service.add_records(table, records)
        except _REFUSALS as error:
            raise ToolError(str(error)) from None
        return _result(text, result)

    add_generate_sql(server, service, config.max_retries, READ_ONLY)
    return server


def _describe(database: Database) -> str:
    """The server's description for people and the router; a SQLite file's table names make its topic findable."""
    kind = "PostgreSQL" if database.backend == "postgresql" else "SQLite"
    tables = ""
    if database.backend == "sqlite":
        try:
            names = [t.name for t in database.read_schema().tables]
        except DatabaseError:
            names = []
        tables = f" (tables: {', '.join(names)})" if names else ""
    return (
        f"SQL on a {kind} database{tables}: describe the schema, run queries, dry-run and confirm writes, "
        "insert records, and turn plain-language requests into SQL."
    )


@hookimpl
def gateway_register_servers(register: RegisterServer, settings: Settings, config: Config | None) -> None:
    """Serve the configured database (the demo shop database when none is configured)."""
    config = config or Config()
    database = open_database(config, settings.data_dir)
    url = settings.database_url
    shared = url if url and url.startswith(("postgresql://", "postgres://")) else None
    register(
        "sql",
        create_server(config, settings.data_dir, database=database, tokens_url=shared),
        description=_describe(database),
        capabilities=["sql", "database", "query", "sqlite", "postgresql"],
    )
