"""Lines from a non-blocking pipe, read by an event-loop callback, the common ones served in it.

A stdio hop used to wake a task for every read: `anyio.wait_readable` registers and removes the
descriptor each time (two `epoll_ctl` calls and a future), and a subprocess' `StreamReader` wakes
its reading task, which only then hands the line on, waking the task that waits for it. Here the
descriptor stays registered, and the read callback offers each line to `fast` (a lean request
taken, a lean answer delivered) right there: the line's consumer wakes on the next turn of the
loop. A line `fast` leaves (the SDK's, a log line to relay) goes to the `slow` task, and reading
pauses until that task has handed on it and every line after it, in order: a line is never
overtaken by a later one, and a consumer that stops receiving stops the reading, as before.

Both stdio hops use it: the downstream client's stdin (`gateway.serving.stdio`) and a stdio
child's stdout (`gateway.upstreams.stdio_child`). POSIX only, as are the pipes they watch.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["READ_SIZE", "read_lines"]

READ_SIZE = 1 << 16
"""Bytes read at a time; a longer message arrives in several reads."""

Line = TypeVar("Line")


class _Reader(Generic[Line]):
    def __init__(
        self,
        fd: int,
        split: Callable[[bytes], Iterable[Line]],
        fast: Callable[[Line], bool],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.fd = fd
        self.split = split
        self.fast = fast
        self.loop = loop
        self.queue: deque[Line] = deque()
        """Lines for the slow task, in order; reading pauses while there are any."""
        self.ended = False
        self.reading = False
        self.wake: asyncio.Future[None] | None = None

    def resume(self) -> None:
        if not self.reading and not self.ended:
            self.loop.add_reader(self.fd, self.on_readable)
            self.reading = True

    def pause(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False

    def on_readable(self) -> None:
        try:
            chunk = os.read(self.fd, READ_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.ended = True
            self.pause()
        else:
            queue, fast = self.queue, self.fast
            for line in self.split(chunk):
                if queue or not fast(line):
                    queue.append(line)
            if queue:
                self.pause()
            else:
                return
        wake = self.wake
        if wake is not None and not wake.done():
            wake.set_result(None)


async def read_lines(
    fd: int,
    split: Callable[[bytes], Iterable[Line]],
    fast: Callable[[Line], bool],
    slow: Callable[[Line], Awaitable[None]],
) -> None:
    """Read `fd` (non-blocking) until end of file or a read error, each line (`split`, which keeps
    a partial line for the next chunk) given to `fast` in the read callback, and when it returns
    False, with every line after it, to `slow` in this task (`fast` first again there, as it may
    take a line now). Returns at end of file once `slow` has had every line; a cancel stops it."""
    reader = _Reader(fd, split, fast, asyncio.get_running_loop())
    reader.resume()
    try:
        while True:
            while not reader.queue and not reader.ended:
                reader.wake = reader.loop.create_future()
                try:
                    await reader.wake
                finally:
                    reader.wake = None
            while reader.queue:
                line = reader.queue.popleft()
                if not fast(line):
                    await slow(line)
            if reader.ended:
                return
            reader.resume()
    finally:
        reader.pause()
