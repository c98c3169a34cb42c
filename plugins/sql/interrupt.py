"""Stopping the statement of a call that was cancelled (its client hung up, or the gateway ended it).

Every database call blocks in a worker thread, and a cancelled task cannot leave
`anyio.to_thread.run_sync` before its thread returns: left alone, a cancelled query ran on to its
time limit, holding its connection and its locks for nobody. `run_interruptible` runs the call in a
thread with an `Interrupt`; the connection registers how to stop it (`interruptible`:
`sqlite3.Connection.interrupt`, psycopg's `Connection.cancel`), and when the awaiting task is
cancelled the interrupt fires: the statement stops inside the database, the thread returns within
milliseconds, and the cancellation goes on. A call that finishes normally fires nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from .database import DatabaseError

__all__ = ["Interrupt", "QueryInterrupted", "interruptible", "run_interruptible"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class QueryInterrupted(DatabaseError):
    """The statement was stopped because its call was cancelled; nobody waits for its answer."""


class Interrupt:
    """One call's way to stop what its worker thread runs in the database.

    `fire` may come from any thread; a connection registered with `interruptible` is stopped at once,
    and one registered after `fire` is refused before it runs anything."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stops: list[Callable[[], object]] = []
        self.fired = False

    def fire(self) -> None:
        with self._lock:  # held while stopping: a connection is never closed under its own interrupt
            self.fired = True
            for stop in self._stops:
                try:
                    stop()
                except Exception:  # a connection that cannot be stopped still ends at its time limit
                    logger.warning("sql: could not interrupt a statement of a cancelled call", exc_info=True)

    def add(self, stop: Callable[[], object]) -> None:
        with self._lock:
            if self.fired:
                raise QueryInterrupted("the call was cancelled before its statement started")
            self._stops.append(stop)

    def remove(self, stop: Callable[[], object]) -> None:
        with self._lock:
            self._stops.remove(stop)


_current: ContextVar[Interrupt | None] = ContextVar("mcp_gateway_sql_interrupt", default=None)
"""The interrupt of the call the current worker thread runs (set by `run_interruptible`)."""


@contextmanager
def interruptible(stop: Callable[[], object]) -> Iterator[Interrupt | None]:
    """While inside, cancelling the current call calls `stop` (from another thread: it must be thread-safe).

    Yields the call's interrupt, so that the database can tell an interrupted statement (its `fired`)
    from one stopped by its time limit; None outside `run_interruptible`."""
    interrupt = _current.get()
    if interrupt is None:
        yield None
        return
    interrupt.add(stop)
    try:
        yield interrupt
    finally:
        interrupt.remove(stop)


async def run_interruptible(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` in a worker thread; if the awaiting task is cancelled, the statement it runs is
    interrupted, the thread is waited for, and the cancellation is raised."""
    interrupt = Interrupt()
    done = False

    def work() -> T:
        token = _current.set(interrupt)
        try:
            return function(*args)
        finally:
            _current.reset(token)

    async def interrupt_when_cancelled() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            if not done:  # cancelled while the thread runs: stop it (psycopg's cancel blocks: in a thread)
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(interrupt.fire)

    result: T | None = None
    failure: Exception | None = None
    async with anyio.create_task_group() as tg:
        tg.start_soon(interrupt_when_cancelled)
        try:
            result = await anyio.to_thread.run_sync(work)  # waits for the thread, even when cancelled
        except Exception as error:  # noqa: BLE001 - raised after the task group (inside, it would be a group)
            failure = error
        done = True
        tg.cancel_scope.cancel()
    await anyio.lowlevel.checkpoint_if_cancelled()  # a cancelled call ends cancelled, whatever its thread returned
    if failure is not None:
        raise failure
    return result  # type: ignore[return-value]  # set when nothing failed
