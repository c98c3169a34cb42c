"""Runtime disables of tools and servers in the shared database, so every replica serves the same set.

An operator's disable on one replica is a row here and a notification (`ChangeBus`); the other
replicas re-read the rows and apply them within a second, and a replica that starts later applies
them before it serves. An enable deletes the row. Unlike a single gateway's in-memory disables,
these outlive a restart of every replica, until an operator enables the tool or server again.
"""

from __future__ import annotations

import time
from typing import Literal

from gateway.state.database import SharedDatabase

__all__ = ["SharedSwitches"]

Kind = Literal["tools", "servers"]
_TABLES: dict[Kind, tuple[str, str]] = {
    "tools": ("disabled_tools", "exposed"),
    "servers": ("disabled_servers", "server"),
}


class SharedSwitches:
    """The disabled tools (by exposed name) and servers (by id) of a deployment, and who disabled them."""

    def __init__(self, database: SharedDatabase) -> None:
        self.database = database

    def disabled(self, kind: Kind) -> dict[str, str]:
        """Name -> who disabled it."""
        table, key = _TABLES[kind]
        return {str(name): str(by) for name, by in self.database.rows(f"SELECT {key}, disabled_by FROM {table}")}

    def set_enabled(self, kind: Kind, name: str, enabled: bool, by: str) -> bool:
        """Enable or disable one tool or server for every replica; returns whether anything changed."""
        table, key = _TABLES[kind]
        with self.database.transaction() as cursor:
            if enabled:
                cursor.execute(f"DELETE FROM {table} WHERE {key} = %s", (name,))
            else:
                cursor.execute(
                    f"INSERT INTO {table} VALUES (%s, %s, %s, %s) ON CONFLICT ({key}) DO NOTHING",
                    (name, by, time.time(), self.database.replica),
                )
            changed = bool(cursor.rowcount)
            if changed:
                self.database.changed(cursor, kind)
        return changed
