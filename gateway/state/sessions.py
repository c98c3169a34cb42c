"""Console sessions in the shared database, so a browser logged in through one replica is logged in on all.

The cookie holds a random id; the table keys it by its sha256 (a copy of the table does not log
anyone in), with the principal as JSON, the CSRF token and the expiry. A logout deletes the row and
notifies the replicas, which drop their cached copy at once.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass

from gateway.state.database import SharedDatabase

__all__ = ["SharedSessions", "StoredSession"]


@dataclass(frozen=True)
class StoredSession:
    principal: str
    """The principal as JSON (the console turns it back into a `Principal`)."""
    csrf: str
    expires: float


def _key(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


class SharedSessions:
    def __init__(self, database: SharedDatabase) -> None:
        self.database = database

    def save(self, session_id: str, session: StoredSession) -> None:
        with self.database.transaction() as cursor:
            cursor.execute("DELETE FROM console_sessions WHERE expires <= %s", (time.time(),))
            cursor.execute(
                "INSERT INTO console_sessions VALUES (%s, %s, %s, %s, %s)",
                (_key(session_id), session.principal, session.csrf, session.expires, self.database.replica),
            )

    def load(self, session_id: str) -> StoredSession | None:
        rows = self.database.rows(
            "SELECT principal, csrf, expires FROM console_sessions WHERE id_hash = %s AND expires > %s",
            (_key(session_id), time.time()),
        )
        return StoredSession(str(rows[0][0]), str(rows[0][1]), float(rows[0][2])) if rows else None

    def delete(self, session_id: str) -> None:
        with self.database.transaction() as cursor:
            cursor.execute("DELETE FROM console_sessions WHERE id_hash = %s", (_key(session_id),))
            self.database.changed(cursor, "sessions")

    def live(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions still exist (a replica drops the others from its cache)."""
        keys = {_key(i): i for i in session_ids}
        rows = self.database.rows(
            "SELECT id_hash FROM console_sessions WHERE id_hash = ANY(%s) AND expires > %s", (list(keys), time.time())
        )
        return {keys[str(row[0])] for row in rows}
