"""Tool fingerprints and the store that remembers them (a small sqlite file in the data dir).

A tool's fingerprint is the sha256 of its description and input schema as canonical
JSON, so a "rug pull" (a tool that changes after it was first seen and trusted) is a
changed fingerprint. The store keeps, per (server, tool): the approved fingerprint
(the first one seen, or the last one approved), a pending one (a change not yet
approved), and whether a person approved the current one with `mcp-gateway tools
approve` (which also releases a tool quarantined for its description). The definitions behind
the fingerprints are kept too (`definitions`, from the time this was added), so the console
can show what changed as a diff.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import mcp_types as types

__all__ = [
    "STORE_NAME",
    "FingerprintChanges",
    "FingerprintStore",
    "IntegrityStore",
    "Observation",
    "StoredTool",
    "canonical",
    "compare_fingerprints",
    "fingerprint",
]

STORE_NAME = "tool-integrity.sqlite3"
Observation = Literal["new", "same", "changed"]


@dataclass(frozen=True)
class FingerprintChanges:
    """What observing fingerprints changes in a store, whichever backend holds it."""

    result: dict[tuple[str, str], tuple[Observation, bool]]
    inserts: list[tuple[str, str, str, str, float]]  # server, tool, exposed, approved, first_seen
    updates: list[tuple[str, str | None, float, str, str]]  # exposed, pending, changed_at, server, tool

    def definitions(self, definition: Callable[[str, str], str]) -> list[tuple[str, str]]:
        """(fingerprint, canonical JSON) of each fingerprint written: new tools' and new pending ones."""
        written = [(row[3], definition(row[0], row[1])) for row in self.inserts]
        written += [(row[1], definition(row[3], row[4])) for row in self.updates if row[1] is not None]
        return written


def compare_fingerprints(
    seen: list[tuple[str, str, str, str]],
    stored: dict[tuple[str, str], tuple[str, str, str | None, str | None]],
    now: float,
) -> FingerprintChanges:
    """Compare (server, tool, exposed name, fingerprint) rows with the stored (exposed, approved,
    pending, trusted) rows: a tool's first fingerprint is approved, a different one later pending;
    only new and changed rows are written. The one rule both the data dir's SQLite and the shared
    PostgreSQL store apply."""
    result: dict[tuple[str, str], tuple[Observation, bool]] = {}
    inserts: list[tuple[str, str, str, str, float]] = []
    updates: list[tuple[str, str | None, float, str, str]] = []
    for server, tool, exposed, seen_fingerprint in seen:
        row = stored.get((server, tool))
        if row is None:
            inserts.append((server, tool, exposed, seen_fingerprint, now))
            result[(server, tool)] = ("new", False)
            continue
        old_exposed, approved, pending, trusted = row
        state: Observation = "same" if approved == seen_fingerprint else "changed"
        new_pending = None if state == "same" else seen_fingerprint
        if (old_exposed, pending) != (exposed, new_pending):
            updates.append((exposed, new_pending, now, server, tool))
        result[(server, tool)] = (state, trusted == seen_fingerprint)
    return FingerprintChanges(result, inserts, updates)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS tools (
    server TEXT NOT NULL,
    tool TEXT NOT NULL,
    exposed TEXT NOT NULL,
    approved TEXT NOT NULL,
    pending TEXT,
    trusted TEXT,
    first_seen REAL NOT NULL,
    changed_at REAL,
    PRIMARY KEY (server, tool)
);
CREATE TABLE IF NOT EXISTS approvals (revision INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS definitions (fingerprint TEXT PRIMARY KEY, definition TEXT NOT NULL);
INSERT INTO approvals SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM approvals);
"""


def canonical(tool: types.Tool) -> str:
    """The description and input schema as canonical JSON (key order does not matter): what is fingerprinted."""
    return json.dumps(
        {"description": tool.description or "", "inputSchema": tool.input_schema},
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def fingerprint(tool: types.Tool) -> str:
    """sha256 of the description and input schema, as canonical JSON (key order does not matter)."""
    return hashlib.sha256(canonical(tool).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class StoredTool:
    server: str
    tool: str
    exposed: str
    approved: str
    pending: str | None
    trusted: str | None


class FingerprintStore(Protocol):
    """Where fingerprints live: `IntegrityStore` (a file in the data dir) or, with a database, the
    deployment's shared record (`gateway.state.fingerprints.SharedIntegrityStore`)."""

    def observe_all(
        self, seen: list[tuple[str, str, str, str]], definition: Callable[[str, str], str] | None = None
    ) -> dict[tuple[str, str], tuple[Observation, bool]]: ...

    def definition(self, fingerprint_: str) -> str | None: ...

    def find(self, name: str) -> list[StoredTool]: ...

    def pending(self) -> list[StoredTool]: ...

    def approve(self, stored: StoredTool) -> str: ...

    def revision(self) -> int: ...


class IntegrityStore:
    """The fingerprints seen so far. Each call is one short transaction, so a running gateway
    and `mcp-gateway tools approve` can share the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @classmethod
    def in_dir(cls, data_dir: Path) -> IntegrityStore:
        return cls(Path(data_dir) / STORE_NAME)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db, db:
            yield db

    def observe(self, server: str, tool: str, exposed: str, seen: str) -> Observation:
        """Record one fingerprint as seen (see `observe_all`)."""
        return self.observe_all([(server, tool, exposed, seen)])[(server, tool)][0]

    def observe_all(
        self, seen: list[tuple[str, str, str, str]], definition: Callable[[str, str], str] | None = None
    ) -> dict[tuple[str, str], tuple[Observation, bool]]:
        """Record (server, tool, exposed name, fingerprint) rows in one transaction.

        The first fingerprint of a tool is approved; a different one later is pending.
        Returns, per (server, tool), what it was and whether a person approved exactly
        this fingerprint (`tools approve`). Only new and changed rows are written, with
        their definition (`definition(server, tool)`: the canonical JSON) when given.
        """
        with self._connect() as db:
            stored = {
                (row[0], row[1]): row[2:]
                for row in db.execute("SELECT server, tool, exposed, approved, pending, trusted FROM tools")
            }
            changes = compare_fingerprints(seen, stored, time.time())
            db.executemany(
                "INSERT INTO tools (server, tool, exposed, approved, first_seen) VALUES (?, ?, ?, ?, ?)",
                changes.inserts,
            )
            db.executemany(
                "UPDATE tools SET exposed = ?, pending = ?, changed_at = ? WHERE server = ? AND tool = ?",
                changes.updates,
            )
            if definition is not None:
                db.executemany("INSERT OR IGNORE INTO definitions VALUES (?, ?)", changes.definitions(definition))
        return changes.result

    def definition(self, fingerprint_: str) -> str | None:
        """The canonical JSON a fingerprint was made from, if it was seen since definitions are kept."""
        with self._connect() as db:
            row = db.execute("SELECT definition FROM definitions WHERE fingerprint = ?", (fingerprint_,)).fetchone()
        return None if row is None else str(row[0])

    def is_trusted(self, server: str, tool: str, seen: str) -> bool:
        """Did a person approve exactly this fingerprint?"""
        with self._connect() as db:
            row = db.execute("SELECT trusted FROM tools WHERE server = ? AND tool = ?", (server, tool)).fetchone()
        return row is not None and row[0] == seen

    def find(self, name: str) -> list[StoredTool]:
        """Tools by exposed name (`prefix__tool`) or `server/tool`."""
        server, slash, tool = name.partition("/")
        query = "SELECT server, tool, exposed, approved, pending, trusted FROM tools WHERE "
        with self._connect() as db:
            if slash:
                rows = db.execute(query + "server = ? AND tool = ?", (server, tool)).fetchall()
            else:
                rows = db.execute(query + "exposed = ?", (name,)).fetchall()
        return [StoredTool(*row) for row in rows]

    def pending(self) -> list[StoredTool]:
        with self._connect() as db:
            rows = db.execute(
                "SELECT server, tool, exposed, approved, pending, trusted FROM tools WHERE pending IS NOT NULL "
                "ORDER BY server, tool"
            ).fetchall()
        return [StoredTool(*row) for row in rows]

    def approve(self, stored: StoredTool) -> str:
        """Approve a tool's current definition (its pending one if it changed); returns that fingerprint."""
        current = stored.pending or stored.approved
        with self._connect() as db:
            db.execute(
                "UPDATE tools SET approved = ?, pending = NULL, trusted = ? WHERE server = ? AND tool = ?",
                (current, current, stored.server, stored.tool),
            )
            db.execute("UPDATE approvals SET revision = revision + 1")
        return current

    def revision(self) -> int:
        """Grows with every approval, so a running gateway can notice one made by the CLI."""
        with self._connect() as db:
            return int(db.execute("SELECT revision FROM approvals").fetchone()[0])
