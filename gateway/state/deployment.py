"""`SharedState`: every piece of shared state of one replica, made from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.security.integrity import FingerprintStore, IntegrityStore
from gateway.state.bus import RESYNC_SECONDS, ChangeBus
from gateway.state.database import SharedDatabase
from gateway.state.fingerprints import SharedIntegrityStore
from gateway.state.ratelimit import SharedRateLimiter
from gateway.state.sessions import SharedSessions
from gateway.state.switches import SharedSwitches

__all__ = ["SharedState", "fingerprint_store"]


def fingerprint_store(database_url: str | None, data_dir: Path, replica: str) -> FingerprintStore:
    """The deployment's fingerprints: in the shared database when there is one, else in the data dir."""
    if database_url and database_url.startswith(("postgresql://", "postgres://")):
        return SharedIntegrityStore(SharedDatabase(database_url, replica))
    return IntegrityStore.in_dir(data_dir)


@dataclass
class SharedState:
    """One replica's view of its deployment's shared state (a PostgreSQL database)."""

    database: SharedDatabase
    bus: ChangeBus
    switches: SharedSwitches
    sessions: SharedSessions
    limiter: SharedRateLimiter

    @property
    def replica(self) -> str:
        return self.database.replica

    @classmethod
    def connect(cls, url: str, replica: str, resync_seconds: float = RESYNC_SECONDS) -> SharedState:
        """Nothing is connected yet: the first use connects (and migrates the schema)."""
        database = SharedDatabase(url, replica)
        return cls(
            database=database,
            bus=ChangeBus(database, resync_seconds),
            switches=SharedSwitches(database),
            sessions=SharedSessions(database),
            limiter=SharedRateLimiter(SharedDatabase(url, replica)),  # its own connection: one per request
        )

    def close(self) -> None:
        self.database.close()
        self.limiter.database.close()
