"""What a stdio server writes on stderr: logged under its name, repeats collapsed, the last lines kept.

Servers are chatty: a Python SDK 1.x server probed with `server/discover` prints some 90
lines of pydantic warnings at every start. So each line goes to the
`gateway.upstream.stderr` logger at DEBUG unless the server's `stderr_log_level` raises
it; a line repeated verbatim is logged once, then "... repeated N times"; and only the
last `STDERR_TAIL` lines are kept, for `mcp-gateway check`/`servers` and the failure
reason. One `StderrLog` per connection attempt: a reason never quotes an earlier attempt.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Callable
from typing import TextIO

import anyio

__all__ = ["MAX_LINE", "STDERR_TAIL", "StderrLog"]

stderr_logger = logging.getLogger("gateway.upstream.stderr")

STDERR_TAIL = 50
"""How many of a stdio server's last stderr lines are kept."""
MAX_LINE = 2000
"""Characters kept of one stderr line; a longer one is cut (memory stays bounded)."""
DRAIN_SECONDS = 0.5
"""How long the end of an attempt waits for the server's last stderr lines to be read."""


class StderrLog:
    """One connection attempt's stderr. `add` takes lines; `tail` holds the last of them."""

    def __init__(
        self, server_id: str, redact: Callable[[str], str] = str, level: int = logging.DEBUG, size: int = STDERR_TAIL
    ) -> None:
        self.server_id, self.redact, self.level = server_id, redact, level
        self._lines: deque[str] = deque(maxlen=size)
        self._previous: str | None = None
        self._repeats = 0
        self._lock = threading.Lock()
        self._done = threading.Event()

    @property
    def tail(self) -> list[str]:
        """The last lines, oldest first (a pending repeat count included)."""
        with self._lock:
            return [*self._lines, *self._summary()]

    @property
    def last_line(self) -> str | None:
        """The last distinct line written (a repeat count is not a line the server wrote)."""
        with self._lock:
            return self._previous

    def add(self, raw: str) -> None:
        line = self.redact(raw.rstrip()[:MAX_LINE])
        if not line:
            return
        with self._lock:
            if line == self._previous:
                self._repeats += 1
                return
            self._flush()
            self._previous = line
            self._keep(line)

    def close(self) -> None:
        """End of the stream: report a pending repeat count."""
        with self._lock:
            self._flush()
        self._done.set()

    def pipe(self) -> TextIO:
        """A pipe for a child's stderr, read into this log by a thread until its last writer closes it."""
        read_fd, write_fd = os.pipe()
        threading.Thread(target=self._pump, args=(read_fd,), name=f"stderr {self.server_id}", daemon=True).start()
        return os.fdopen(write_fd, "w")

    async def drained(self, timeout: float = DRAIN_SECONDS) -> None:
        """Wait (bounded: a grandchild may hold the pipe open) until the pipe has been read to its end."""
        with anyio.move_on_after(timeout):
            while not self._done.is_set():
                await anyio.sleep(0.01)

    def _pump(self, read_fd: int) -> None:
        try:
            with os.fdopen(read_fd, "r", errors="replace") as pipe:
                cut = False  # the rest of a line longer than MAX_LINE is dropped
                for chunk in iter(lambda: pipe.readline(MAX_LINE), ""):
                    if not cut:
                        self.add(chunk)
                    cut = not chunk.endswith("\n")
        finally:
            self.close()

    def _summary(self) -> list[str]:
        return [f"... repeated {self._repeats} times"] if self._repeats else []

    def _flush(self) -> None:
        for line in self._summary():
            self._keep(line)
        self._repeats = 0

    def _keep(self, line: str) -> None:
        self._lines.append(line)
        stderr_logger.log(self.level, "[%s] %s", self.server_id, line)
