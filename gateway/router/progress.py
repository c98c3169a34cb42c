"""A progress bar on stderr for long index builds, drawn only when stderr is a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["TerminalProgress"]


class TerminalProgress:
    """Call with `(done, total)`; draws `label [#####.....] done/total` at most 10 times a second.

    Silent when the stream is not a terminal (logs, pipes, CI) or the job is small.
    """

    def __init__(self, label: str, *, stream: TextIO | None = None, minimum: int = 200, width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.minimum = minimum
        self.width = width
        self._last = 0.0
        self._active = self.stream.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not self._active or total < self.minimum:
            return
        now = time.monotonic()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        end = "\n" if done >= total else ""
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total}{end}")
        self.stream.flush()
