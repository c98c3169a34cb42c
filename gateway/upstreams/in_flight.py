"""The requests in flight to one upstream: counted, waited for, and cancelled.

A server removed from (or changed in) the configuration drains: its requests in flight get a
bounded time to finish (`wait_done`), then the rest are cancelled (`cancel`), each ending with
an error that says why, before its session is closed.
"""

from __future__ import annotations

import anyio

__all__ = ["InFlight"]


class InFlight:
    """Each request runs in its own cancel scope, from `begin` to `end`."""

    def __init__(self) -> None:
        self.count = 0
        self.cancelled_because: str | None = None
        """Why the requests were cancelled, for their error."""
        self._scopes: set[anyio.CancelScope] = set()
        self._done: anyio.Event | None = None
        """Set when the count falls to 0; made only while someone waits for that."""

    def begin(self) -> anyio.CancelScope:
        """A request starts: enter the scope returned (`with`), and call `end` with it in a `finally`."""
        scope = anyio.CancelScope()
        self._scopes.add(scope)
        self.count += 1
        return scope

    def end(self, scope: anyio.CancelScope) -> None:
        self._scopes.discard(scope)
        self.count -= 1
        if not self.count and self._done is not None:
            self._done.set()
            self._done = None

    async def wait_done(self) -> None:
        """Wait until no request is in flight."""
        while self.count:
            if self._done is None:
                self._done = anyio.Event()
            await self._done.wait()

    def cancel(self, because: str) -> None:
        """Cancel every request in flight; `because` is for their errors."""
        self.cancelled_because = because
        for scope in list(self._scopes):
            scope.cancel()
