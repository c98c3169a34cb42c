"""The records schema, as numbered steps applied in order on start (`schema_version` says how far).

Each step is plain SQL that SQLite and PostgreSQL both accept (text ids, Unix-second
timestamps as DOUBLE PRECISION), so one list serves both backends. Never edit a step
that has shipped: add the next one.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MIGRATIONS", "Migration"]


@dataclass(frozen=True)
class Migration:
    version: int
    description: str
    sql: str

    def statements(self) -> list[str]:
        return [part.strip() for part in self.sql.split(";") if part.strip()]


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "executions, failures, feedback and searches",
        """
        CREATE TABLE executions (
            id TEXT PRIMARY KEY,
            at DOUBLE PRECISION NOT NULL,
            server TEXT NOT NULL,
            tool TEXT NOT NULL,
            session_id TEXT,
            client_id TEXT,
            arguments TEXT,
            response_summary TEXT,
            response_size BIGINT,
            latency_ms DOUBLE PRECISION NOT NULL,
            status TEXT NOT NULL,
            error_code TEXT,
            attempts INTEGER NOT NULL,
            search_id TEXT
        );
        CREATE INDEX executions_by_time ON executions (at);
        CREATE INDEX executions_by_tool ON executions (server, tool);
        CREATE TABLE failures (
            execution_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            error_type TEXT NOT NULL,
            code TEXT NOT NULL,
            details TEXT NOT NULL,
            PRIMARY KEY (execution_id, seq)
        );
        CREATE TABLE feedback (
            token TEXT PRIMARY KEY,
            execution_id TEXT NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            rating TEXT,
            score INTEGER,
            comment TEXT,
            client_id TEXT
        );
        CREATE INDEX feedback_by_time ON feedback (at);
        CREATE TABLE searches (
            id TEXT PRIMARY KEY,
            at DOUBLE PRECISION NOT NULL,
            session_id TEXT,
            client_id TEXT,
            query TEXT,
            results TEXT NOT NULL,
            latency_ms DOUBLE PRECISION NOT NULL
        );
        CREATE INDEX searches_by_time ON searches (at)
        """,
    ),
    Migration(
        2,
        "the trace id of each execution (tracing, issue 16)",
        """
        ALTER TABLE executions ADD COLUMN trace_id TEXT
        """,
    ),
    Migration(
        3,
        "the admin audit trail, and indexes for the console's call log (issue 18)",
        """
        CREATE TABLE audit (
            id TEXT PRIMARY KEY,
            at DOUBLE PRECISION NOT NULL,
            principal TEXT NOT NULL,
            action TEXT NOT NULL,
            target TEXT,
            outcome TEXT NOT NULL,
            details TEXT
        );
        CREATE INDEX audit_by_time ON audit (at);
        CREATE INDEX executions_by_server_time ON executions (server, at);
        CREATE INDEX executions_by_tool_time ON executions (tool, at);
        CREATE INDEX executions_by_status_time ON executions (status, at);
        CREATE INDEX feedback_by_execution ON feedback (execution_id);
        CREATE INDEX executions_window ON executions (at, server, status, latency_ms)
        """,
    ),
    Migration(
        4,
        "the replica that made each execution and audit row (issue 31)",
        """
        ALTER TABLE executions ADD COLUMN replica TEXT;
        ALTER TABLE audit ADD COLUMN replica TEXT
        """,
    ),
    Migration(
        5,
        "code mode: the parent execution of each call (a program's run, issue 27)",
        """
        ALTER TABLE executions ADD COLUMN parent_id TEXT;
        CREATE INDEX executions_by_parent ON executions (parent_id)
        """,
    ),
)
