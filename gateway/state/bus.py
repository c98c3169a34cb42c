"""Change fan-out between replicas: PostgreSQL LISTEN/NOTIFY, with a periodic resync as the fallback.

A replica that changes shared state bumps the topic's revision and notifies in the same
transaction (`SharedDatabase.changed`); every replica's `ChangeBus.run` hears it within
milliseconds and calls that topic's handlers, which re-read the state from the database. A
notification can be lost (the listening connection dropped, a replica was busy starting): every
`resync_seconds` the bus reads the revisions and calls the handlers of any topic whose revision
moved, and after the listening connection is made again it calls every handler once.
Handlers of one topic never run twice at once; a burst of notifications runs them once more.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import anyio

from gateway.state.database import CHANNEL, SharedDatabase, SharedStateError

__all__ = ["RESYNC_SECONDS", "ChangeBus", "Topic"]

logger = logging.getLogger(__name__)

Topic = Literal["approvals", "tools", "servers", "sessions", "flush"]
TOPICS: tuple[Topic, ...] = ("approvals", "tools", "servers", "sessions", "flush")
RESYNC_SECONDS = 5.0
"""How often a replica re-reads the revisions, in case a notification was lost."""
RECONNECT_SECONDS = (0.5, 1.0, 2.0, 5.0)

Handler = Callable[[], Awaitable[None]]


class ChangeBus:
    """Runs each topic's handlers when another replica (or this one) changes that topic's state."""

    def __init__(self, database: SharedDatabase, resync_seconds: float = RESYNC_SECONDS) -> None:
        self.database = database
        self.resync_seconds = resync_seconds
        self.handlers: dict[str, list[Handler]] = {}
        self.heard = 0
        """Notifications heard so far (for tests and logs)."""
        self._due: set[str] = set()
        self._wake = anyio.Event()
        self._revisions: dict[str, int] = {}

    def subscribe(self, topic: Topic, handler: Handler) -> None:
        self.handlers.setdefault(topic, []).append(handler)

    def publish(self, topic: Topic) -> None:
        """Notify every replica now (synchronous: from a worker thread)."""
        self.database.notify(topic)

    def mark(self, *topics: str) -> None:
        """Have these topics' handlers run soon (coalesced)."""
        self._due.update(topics)
        self._wake.set()

    async def run(self) -> None:
        """Listen, resync and dispatch until cancelled."""
        try:
            self._revisions = await anyio.to_thread.run_sync(self.database.revisions)
        except SharedStateError as error:
            logger.warning("shared state: could not read the revisions: %s", error)
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._listen)
            tg.start_soon(self._resync)
            await self._dispatch()

    async def _dispatch(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            due, self._due = self._due, set()
            for topic in TOPICS:
                if topic not in due:
                    continue
                for handler in self.handlers.get(topic, []):
                    try:
                        await handler()
                    except SharedStateError as error:  # the resync or the reconnection brings it later
                        logger.warning("shared state: could not apply a change to %s: %s", topic, error)
                    except Exception:  # boundary: one handler's bug must not stop the fan-out
                        logger.exception("shared state: the %s handler failed", topic)

    async def _resync(self) -> None:
        while True:
            await anyio.sleep(self.resync_seconds)
            try:
                now = await anyio.to_thread.run_sync(self.database.revisions)
            except SharedStateError as error:
                logger.warning("shared state: resync failed: %s", error)
                continue
            moved = [topic for topic, revision in now.items() if self._revisions.get(topic) != revision]
            self._revisions = now
            if moved:
                logger.info("shared state: resync found changes to %s", ", ".join(sorted(moved)))
                self.mark(*moved)

    async def _listen(self) -> None:
        import psycopg  # with a shared database only (`gateway.state.database`)

        attempt = 0
        while True:
            try:
                connection = await psycopg.AsyncConnection.connect(
                    self.database.url, autocommit=True, connect_timeout=5
                )
            except (psycopg.Error, OSError) as error:
                delay = RECONNECT_SECONDS[min(attempt, len(RECONNECT_SECONDS) - 1)]
                logger.warning("shared state: cannot listen for changes (retry in %g s): %s", delay, _line(error))
                attempt += 1
                await anyio.sleep(delay)
                continue
            try:
                async with connection:
                    await connection.execute(f"LISTEN {CHANNEL}")
                    if attempt:
                        self.mark(*self.handlers)  # what changed while this replica was not listening
                    attempt = 0
                    async for notice in connection.notifies():
                        self._heard(notice.payload)
            except (psycopg.Error, OSError) as error:
                logger.warning("shared state: the change listener lost its connection: %s", _line(error))
                attempt += 1
                await anyio.sleep(RECONNECT_SECONDS[0])

    def _heard(self, payload: str) -> None:
        topic = payload.partition(" ")[0]
        self.heard += 1
        if topic in self.handlers:
            self.mark(topic)


def _line(error: Any) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__
