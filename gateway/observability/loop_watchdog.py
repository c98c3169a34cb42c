"""A watchdog for the event loop: names the code that blocks it, so one plugin cannot stall
every client in silence.

Plugin servers run on the gateway's event loop (docs/plugins.md, "The event loop rule"). A
task on the loop notes the time every `interval`; a thread checks that note, and when the
loop has not come back for `threshold` seconds it reads the loop thread's stack
(`sys._current_frames`), finds the innermost frame of plugin code, and reports it once per
stall: a warning log line naming the plugin, the function (a tool's function) and its file
and line, and a count in the metrics. When the loop comes back, the stall's length is logged.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

import anyio

__all__ = ["Stall", "LoopWatchdog", "blocking_frame"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Stall:
    """Who held the event loop: the plugin (None when no plugin code is on the stack), the function, where."""

    plugin: str | None
    function: str
    file: str
    line: int
    seconds: float
    """How long the loop had been held when it was caught."""

    def describe(self) -> str:
        who = f"plugin {self.plugin!r}" if self.plugin else "code outside any plugin"
        return f"{who}, in {self.function}() at {self.file}:{self.line}"


def blocking_frame(frame: FrameType | None, plugin_of: Callable[[str], str | None]) -> tuple[str | None, FrameType]:
    """The innermost frame of plugin code on the stack starting at `frame` (innermost first), with its
    plugin; else the innermost frame and None."""
    innermost = frame
    while frame is not None:
        plugin = plugin_of(str(frame.f_globals.get("__name__", "")))
        if plugin is not None:
            return plugin, frame
        frame = frame.f_back
    assert innermost is not None
    return None, innermost


class LoopWatchdog:
    """Run `watch()` in the loop's task group; `on_stall` gets each stall once (from the watchdog thread)."""

    def __init__(
        self,
        plugin_of: Callable[[str], str | None],
        on_stall: Callable[[Stall], None],
        *,
        threshold: float = 0.5,
        interval: float = 0.05,
    ) -> None:
        self.plugin_of = plugin_of
        self.on_stall = on_stall
        self.threshold = threshold
        self.interval = interval
        self._beat = time.monotonic()
        self._loop_thread: int | None = None
        self._stop = threading.Event()
        self.stalls = 0

    async def watch(self) -> None:
        """Note the time on the loop every `interval`, with the checking thread running beside it."""
        self._loop_thread = threading.get_ident()
        self._beat = time.monotonic()
        self._stop.clear()
        checker = threading.Thread(target=self._check, name="event-loop watchdog", daemon=True)
        checker.start()
        try:
            while True:
                self._beat = time.monotonic()
                await anyio.sleep(self.interval)
        finally:
            self._stop.set()

    def _check(self) -> None:
        reported_beat: float | None = None
        stall_started = 0.0
        while not self._stop.wait(self.interval / 2):
            beat = self._beat
            held = time.monotonic() - beat
            if held < self.threshold + self.interval:
                if reported_beat is not None and beat != reported_beat:
                    logger.warning("event loop: free again after %.2f s", beat - stall_started)
                    reported_beat = None
                continue
            if reported_beat == beat:
                continue  # this stall is reported already
            frame = sys._current_frames().get(self._loop_thread or 0)
            if frame is None:
                continue
            plugin, found = blocking_frame(frame, self.plugin_of)
            stall = Stall(plugin, found.f_code.co_name, found.f_code.co_filename, found.f_lineno, held)
            reported_beat, stall_started = beat, beat
            self.stalls += 1
            del frame, found
            try:
                self.on_stall(stall)
            except Exception:  # boundary: a failing report must not stop the watchdog
                logger.exception("event loop watchdog: reporting a stall failed")
