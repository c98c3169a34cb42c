"""Per-caller token buckets: `burst` requests at once, refilled at `per_minute` a minute."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gateway.config.security import RateLimit

__all__ = ["Limiter", "RateLimiter", "TokenBucket"]


class Limiter(Protocol):
    """What the HTTP guard asks: this replica's buckets (`RateLimiter`) or the deployment's
    (`gateway.state.ratelimit.SharedRateLimiter`)."""

    async def admit(self, name: str, limit: RateLimit) -> int:
        """0 when the request may go on, else the whole seconds to wait (for `Retry-After`)."""
        ...


@dataclass
class TokenBucket:
    """A bucket of `capacity` tokens refilled at `rate` tokens a second; one request takes one."""

    capacity: float
    rate: float
    tokens: float
    stamp: float

    def take(self, now: float) -> float:
        """Take a token; returns 0 when allowed, else the seconds until one is available."""
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


class RateLimiter:
    """One bucket per caller name, created on first use with that caller's limit."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, name: str, limit: RateLimit) -> int:
        """0 when the request may go on, else the whole seconds to wait (for `Retry-After`)."""
        now = self._clock()
        bucket = self._buckets.get(name)
        if bucket is None or bucket.capacity != limit.burst or bucket.rate != limit.per_minute / 60:
            bucket = self._buckets[name] = TokenBucket(limit.burst, limit.per_minute / 60, limit.burst, now)
        wait = bucket.take(now)
        return 0 if wait == 0 else max(1, math.ceil(wait))

    async def admit(self, name: str, limit: RateLimit) -> int:
        """`check`, as the HTTP guard awaits it (a shared limiter asks the database instead)."""
        return self.check(name, limit)
