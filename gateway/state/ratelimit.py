"""Rate limits that hold across replicas: one token bucket per caller in the shared database.

Each check is one statement, one round trip: an upsert that refills the bucket by the time passed on the
database's clock (so the replicas' clocks do not matter), takes a token when there is one, and
says whether it did. The row lock makes concurrent checks of one caller, on any replica, happen
one after the other, so N replicas allow exactly the configured burst and rate between them. The
table is UNLOGGED and the connection commits without waiting for the disk: a bucket is not worth
a flush, and a crash of the database forgets the buckets (everyone starts full again).
When the database cannot be reached, each replica falls back to its own buckets and says so.
"""

from __future__ import annotations

import logging
import math
import time

import anyio

from gateway.config.security import RateLimit
from gateway.security.ratelimit import RateLimiter
from gateway.state.database import SharedDatabase, SharedStateError

__all__ = ["SharedRateLimiter"]

logger = logging.getLogger(__name__)

FALLBACK_LOG_EVERY = 60.0

_REFILLED = "LEAST(%(burst)s, b.tokens + (extract(epoch FROM clock_timestamp()) - b.stamp) * %(rate)s)"
_TAKE = f"""
INSERT INTO rate_buckets AS b (name, tokens, stamp, taken)
VALUES (%(name)s, %(burst)s - 1, extract(epoch FROM clock_timestamp()), true)
ON CONFLICT (name) DO UPDATE SET
    tokens = {_REFILLED} - CASE WHEN {_REFILLED} >= 1 THEN 1 ELSE 0 END,
    stamp = extract(epoch FROM clock_timestamp()),
    taken = {_REFILLED} >= 1
RETURNING tokens, taken
"""


class SharedRateLimiter:
    """`RateLimiter`'s `admit` over the shared database (see the module's docstring)."""

    def __init__(self, database: SharedDatabase) -> None:
        self.database = database
        self.local = RateLimiter()
        """The fallback while the database cannot be reached."""
        self._last_warning = -FALLBACK_LOG_EVERY
        self._configured = False

    def take(self, name: str, limit: RateLimit) -> int:
        """0 when the request may go on, else the whole seconds to wait (synchronous: from a worker thread)."""
        rate = limit.per_minute / 60
        try:
            with self.database.statement() as cursor:
                if not self._configured:
                    cursor.execute("SET synchronous_commit = off")
                    self._configured = True
                cursor.execute(_TAKE, {"name": name, "burst": float(limit.burst), "rate": rate})
                row = cursor.fetchone()
        except SharedStateError as error:
            self._configured = False
            now = time.monotonic()
            if now - self._last_warning >= FALLBACK_LOG_EVERY:
                self._last_warning = now
                logger.warning("rate limits: each replica counts alone until the database is back: %s", error)
            return self.local.check(name, limit)
        if row is None or row[1]:
            return 0
        return max(1, math.ceil((1 - float(row[0])) / rate))

    async def admit(self, name: str, limit: RateLimit) -> int:
        return await anyio.to_thread.run_sync(self.take, name, limit)
