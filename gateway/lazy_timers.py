"""Timers for deadlines that are set on every call and almost never reached.

An asyncio timer per call (a `TimerHandle` made, pushed on the loop's heap, cancelled when the
call ends in time) costs more than some calls' own work on the gateway's hot path. Two shapes of
deadline cover its uses, each behind one timer:

- `DueQueue`: many entries with the same delay (calls under one timeout, requests under one
  silence window). They fall due in the order they were added, so one FIFO and one timer, set for
  the oldest entry still standing, do the work; an entry that ended is dropped when next seen.
- `LazyDeadline`: one deadline moved on every use (a connection's read timeout, a session's idle
  expiry). Moving it later only notes the new time; the timer, when it fires early, is set again
  for the time now noted.

Both run on one asyncio event loop and are not thread-safe, like the loop's own `call_at`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["EARLY", "DueEntry", "DueQueue", "LazyDeadline"]

EARLY = 0.001
"""A timer may fire this much before its time (the loop runs handles due within its clock's
resolution): a deadline that close counts as reached."""

T = TypeVar("T")


class DueEntry(Generic[T]):
    """One entry of a `DueQueue`; `done()` takes it out (it will not fall due)."""

    __slots__ = ("due", "item")

    def __init__(self, due: float, item: T) -> None:
        self.due = due
        self.item: T | None = item

    def done(self) -> None:
        self.item = None


class DueQueue(Generic[T]):
    """Items handed to `on_due` `delay` seconds after they were added, unless done first."""

    __slots__ = ("delay", "_loop", "_on_due", "_entries", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, delay: float, on_due: Callable[[T], object]) -> None:
        self.delay = delay
        self._loop = loop
        self._on_due = on_due
        self._entries: deque[DueEntry[T]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, item: T) -> DueEntry[T]:
        entries = self._entries
        while entries and entries[0].item is None:
            entries.popleft()
        entry = DueEntry(self._loop.time() + self.delay, item)
        entries.append(entry)
        if self._timer is None:
            self._timer = self._loop.call_at(entry.due, self._fire)
        return entry

    def __len__(self) -> int:
        """Entries not yet done (counted: for tests and diagnostics, not the hot path)."""
        return sum(1 for e in self._entries if e.item is not None)

    def close(self) -> None:
        """Forget every entry and stop the timer (the loop or its owner is going away)."""
        self._entries.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        now = self._loop.time()
        entries = self._entries
        due: list[T] = []
        while entries:
            head = entries[0]
            if head.item is not None and head.due - now > EARLY:
                self._timer = self._loop.call_at(head.due, self._fire)
                break
            entries.popleft()
            if head.item is not None:
                due.append(head.item)
        # After the timer is set again: whatever `on_due` does, the later entries stay watched.
        for item in due:
            self._on_due(item)


class LazyDeadline:
    """One deadline, moved often, behind one timer: `on_due` runs once it is reached.

    `set(at)` moves it; a later time only notes it (the timer, when it fires, is set again for
    it), an earlier one sets the timer again. `clear()` means no deadline until the next `set`."""

    __slots__ = ("at", "_loop", "_on_due", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_due: Callable[[], object]) -> None:
        self.at: float | None = None
        self._loop = loop
        self._on_due = on_due
        self._timer: asyncio.TimerHandle | None = None

    def set(self, at: float) -> None:
        self.at = at
        timer = self._timer
        if timer is None or timer.when() > at:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(at, self._fire)

    def clear(self) -> None:
        self.at = None

    def close(self) -> None:
        """No deadline and no timer (the owner is going away)."""
        self.at = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        at = self.at
        if at is None:
            return
        if at - self._loop.time() > EARLY:
            self._timer = self._loop.call_at(at, self._fire)
            return
        self.at = None
        self._on_due()
