"""Tool fingerprints and approvals in the shared database: one record for every replica.

The same rules as `gateway.security.integrity.IntegrityStore` (the first fingerprint seen is
approved, a different one later is pending until a person approves it), kept in the
deployment's database, so that a replica started with an empty data dir compares an
upstream's current definition with the deployment's record, never with nothing. Observations
are serialized between replicas by an advisory lock, so two replicas that see a new tool at once
agree on its first fingerprint. When the database cannot be reached, the last rows read stand
in, and a tool they do not know is treated as changed (withheld under `tool_changes: block`):
an outage never lets an unapproved definition through.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from gateway.security.integrity import Observation, StoredTool, compare_fingerprints
from gateway.state.database import SharedDatabase, SharedStateError

__all__ = ["SharedIntegrityStore"]

logger = logging.getLogger(__name__)

_OBSERVE_LOCK = 0x6D636670  # "mcfp"
RETRY_SECONDS = 5.0
"""After a failure, how long vetting uses the last rows read without trying the database again."""
_COLUMNS = "server, tool, exposed, approved, pending, trusted"


class SharedIntegrityStore:
    """`IntegrityStore`'s interface over the shared database (see the module's docstring)."""

    def __init__(self, database: SharedDatabase) -> None:
        self.database = database
        self.description = database.description
        self._known: dict[tuple[str, str], tuple[str, str | None]] = {}
        """(server, tool) -> (approved, trusted), as last read: what stands in during an outage."""
        self._revision = 0
        self._retry_at = 0.0

    def observe(self, server: str, tool: str, exposed: str, seen: str) -> Observation:
        return self.observe_all([(server, tool, exposed, seen)])[(server, tool)][0]

    def observe_all(
        self, seen: list[tuple[str, str, str, str]], definition: Callable[[str, str], str] | None = None
    ) -> dict[tuple[str, str], tuple[Observation, bool]]:
        try:
            if time.monotonic() < self._retry_at:
                raise SharedStateError(f"{self.description}: unreachable moments ago")
            return self._observe_all(seen, definition)
        except SharedStateError as error:
            # Vetting runs on the event loop: do not wait for the database on every rebuild while it is down.
            self._retry_at = time.monotonic() + RETRY_SECONDS
            logger.warning("tool vetting from the last rows read (%d tools): %s", len(self._known), error)
            result: dict[tuple[str, str], tuple[Observation, bool]] = {}
            for server, tool, _, fingerprint in seen:
                approved, trusted = self._known.get((server, tool), ("", None))
                result[(server, tool)] = ("same" if approved == fingerprint else "changed", trusted == fingerprint)
            return result

    def _observe_all(
        self, seen: list[tuple[str, str, str, str]], definition: Callable[[str, str], str] | None
    ) -> dict[tuple[str, str], tuple[Observation, bool]]:
        servers = sorted({server for server, *_ in seen})
        with self.database.transaction() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_OBSERVE_LOCK,))
            cursor.execute(f"SELECT {_COLUMNS} FROM tool_fingerprints WHERE server = ANY(%s)", (servers,))
            stored = {(row[0], row[1]): row[2:] for row in cursor.fetchall()}
            changes = compare_fingerprints(seen, stored, time.time())
            for server, tool, _, approved_now, _ in changes.inserts:
                self._known[(server, tool)] = (approved_now, None)
            for key in changes.result:
                if key in stored:
                    self._known[key] = (stored[key][1], stored[key][3])
            if changes.inserts:
                cursor.executemany(
                    "INSERT INTO tool_fingerprints (server, tool, exposed, approved, first_seen) "
                    "VALUES (%s, %s, %s, %s, %s)",
                    changes.inserts,
                )
            if changes.updates:
                cursor.executemany(
                    "UPDATE tool_fingerprints SET exposed = %s, pending = %s, changed_at = %s "
                    "WHERE server = %s AND tool = %s",
                    changes.updates,
                )
            if definition is not None:
                written = changes.definitions(definition)
                if written:
                    cursor.executemany(
                        "INSERT INTO tool_definitions VALUES (%s, %s) ON CONFLICT (fingerprint) DO NOTHING", written
                    )
        return changes.result

    def definition(self, fingerprint_: str) -> str | None:
        rows = self.database.rows("SELECT definition FROM tool_definitions WHERE fingerprint = %s", (fingerprint_,))
        return str(rows[0][0]) if rows else None

    def is_trusted(self, server: str, tool: str, seen: str) -> bool:
        rows = self.database.rows(
            "SELECT trusted FROM tool_fingerprints WHERE server = %s AND tool = %s", (server, tool)
        )
        return bool(rows) and rows[0][0] == seen

    def find(self, name: str) -> list[StoredTool]:
        server, slash, tool = name.partition("/")
        query = f"SELECT {_COLUMNS} FROM tool_fingerprints WHERE "
        if slash:
            rows = self.database.rows(query + "server = %s AND tool = %s", (server, tool))
        else:
            rows = self.database.rows(query + "exposed = %s", (name,))
        return [StoredTool(*row) for row in rows]

    def pending(self) -> list[StoredTool]:
        rows = self.database.rows(
            f"SELECT {_COLUMNS} FROM tool_fingerprints WHERE pending IS NOT NULL ORDER BY server, tool"
        )
        return [StoredTool(*row) for row in rows]

    def approve(self, stored: StoredTool) -> str:
        """Approve a tool's current definition, and tell every replica (they re-vet within a second)."""
        current = stored.pending or stored.approved
        with self.database.transaction() as cursor:
            cursor.execute(
                "UPDATE tool_fingerprints SET approved = %s, pending = NULL, trusted = %s "
                "WHERE server = %s AND tool = %s",
                (current, current, stored.server, stored.tool),
            )
            self.database.changed(cursor, "approvals")
        self._known[(stored.server, stored.tool)] = (current, current)
        return current

    def revision(self) -> int:
        """Grows with every approval by any replica or `mcp-gateway tools approve`."""
        try:
            rows = self.database.rows("SELECT revision FROM state_revisions WHERE topic = 'approvals'")
        except SharedStateError as error:
            logger.warning("could not read the approvals' revision: %s", error)
            return self._revision
        self._revision = int(rows[0][0]) if rows else 0
        return self._revision
