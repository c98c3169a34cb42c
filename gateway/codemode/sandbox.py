"""The sandbox: a pool of `monty` worker processes that run programs, and the limits they run under.

`pydantic-monty` runs Python in a Rust interpreter with no filesystem, network, environment or
imports beyond its own small standard library, in worker *processes*: a program that crashes its
interpreter kills a worker, which the pool replaces; the gateway's process is never at risk. A
host function the program calls (a tool) suspends the interpreter and comes back to this process
over the worker's pipe.

The pool is started on the first run (a gateway that never runs a program starts no worker) by a
task in the registry's task group, which closes it when the registry stops. Every limit a program
can hit is named in its error with the setting that raises it (`LIMITS`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from gateway.codemode.program_api import TOOL_CALLS_LIMIT, ProgramTools
from gateway.config.routing_settings import CodeModeSettings

if TYPE_CHECKING:
    from pydantic_monty import AsyncMonty, MontyRuntimeError, ResourceLimits


__all__ = ["ProgramError", "RunOutcome", "SandboxPool"]

logger = logging.getLogger(__name__)

WALL_LIMIT = "wall time (GATEWAY_CODEMODE__WALL_SECONDS)"
CPU_LIMIT = "CPU time (GATEWAY_CODEMODE__CPU_SECONDS)"
MEMORY_LIMIT = "memory (GATEWAY_CODEMODE__MEMORY_MB)"
RECURSION_LIMIT = "recursion depth (GATEWAY_CODEMODE__MAX_RECURSION_DEPTH)"
SLEEP_LIMIT = "sleep time (GATEWAY_CODEMODE__WALL_SECONDS)"
OUTPUT_LIMIT = "output size (GATEWAY_CODEMODE__MAX_OUTPUT_BYTES)"


@dataclass
class ProgramError:
    """Why a program did not finish: its exception, the line it was at, the limit it hit."""

    type: str
    message: str
    line: int | None = None
    source: str | None = None
    limit: str | None = None


@dataclass
class RunOutcome:
    """What one run produced; `error` is None when the program finished."""

    value: Any = None
    output: str = ""
    output_dropped: int = 0
    """Bytes of printed output past `max_output_bytes`, not kept."""
    error: ProgramError | None = None
    checkout_ms: float = 0.0
    """How long getting a worker took (a warm one: about a millisecond)."""
    run_ms: float = 0.0
    tools: ProgramTools | None = field(default=None, repr=False)


class _Printed:
    """The program's printed output, kept up to `limit` bytes; the rest counted, not kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.kept = 0
        self.dropped = 0

    def __call__(self, stream: str, text: str) -> None:
        size = len(text.encode("utf-8"))
        room = self.limit - self.kept
        if size <= room:
            self.parts.append(text)
            self.kept += size
            return
        if room > 0:
            part = text.encode("utf-8")[:room].decode("utf-8", "ignore")
            self.parts.append(part)
            self.kept += len(part.encode("utf-8"))
        self.dropped += size - max(room, 0)

    def text(self) -> str:
        return "".join(self.parts)


_PLAIN: dict[str, Callable[[CodeModeSettings], str]] = {
    CPU_LIMIT: lambda s: f"CPU time limit: the program computed for more than {s.cpu_seconds:g} s",
    MEMORY_LIMIT: lambda s: f"memory limit: the program needed more than {s.memory_mb} MiB",
    SLEEP_LIMIT: lambda s: f"sleep limit: the program slept for more than {s.wall_seconds:g} s in all",
}
"""The message of a limit hit inside the interpreter, in the gateway's words and units."""


def _limit_of(kind: str, message: str) -> str | None:
    """The named limit behind an interpreter error, from the type and message monty gives it."""
    if kind == "TimeoutError" and "feed time limit" in message:
        return CPU_LIMIT
    if kind == "TimeoutError" and "sleep limit" in message:
        return SLEEP_LIMIT
    if kind == "MemoryError" and "memory limit" in message:
        return MEMORY_LIMIT
    if kind == "RecursionError":
        return RECURSION_LIMIT
    if kind == "RuntimeError" and "suspension limit" in message:
        return TOOL_CALLS_LIMIT
    return None


def _runtime_error(error: MontyRuntimeError) -> ProgramError:
    exception = error.exception()
    kind = type(exception).__name__
    message = str(exception)
    frames = error.traceback()
    line = frames[-1].line if frames else None
    source = frames[-1].source_line if frames else None
    return ProgramError(kind, message, line, source.strip() if source else None, _limit_of(kind, message))


class SandboxPool:
    """The worker processes programs run in (started on first use) and one run's limits."""

    def __init__(self, settings: CodeModeSettings, task_group: Callable[[], anyio.abc.TaskGroup]) -> None:
        self.settings = settings
        self._task_group = task_group
        self._pool: AsyncMonty | None = None
        self._starting = anyio.Lock()

    async def _hold(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        # pydantic-monty is imported with the first program (~5 MB that a gateway whose clients never
        # run one does not keep); the workers start then anyway.
        from pydantic_monty import AsyncMonty

        settings = self.settings
        pool = AsyncMonty(
            min_processes=min(settings.warm_workers, settings.workers),
            max_processes=settings.workers,
            checkout_timeout=settings.wall_seconds,
            request_timeout=settings.cpu_seconds + 5,  # the backstop for a worker that stops answering
        )
        try:
            async with pool:
                self._pool = pool
                logger.info("code mode: sandbox pool started (at most %d workers)", settings.workers)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._pool = None
            # The pool's I/O threads end just after it closes; an interpreter that exits in that moment
            # aborts (seen with pydantic-monty 1.4.0), so give them it before anything else goes on.
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.05)

    async def pool(self) -> AsyncMonty:
        """The running pool, started on first use."""
        async with self._starting:
            if self._pool is None:
                await self._task_group().start(self._hold)
        assert self._pool is not None
        return self._pool

    def limits(self) -> ResourceLimits:
        settings = self.settings
        return {
            "max_feed_duration_secs": settings.cpu_seconds,
            "max_memory": settings.memory_mb * 1024 * 1024,
            "max_recursion_depth": settings.max_recursion_depth,
            # Host round trips: each tool call, plus sleeps and awaited futures; `ProgramTools` counts the
            # calls themselves and names the limit first, this only backstops it.
            "max_suspensions": 3 * settings.max_tool_calls + 100,
            "max_total_sleep_secs": settings.wall_seconds,
        }

    async def run(self, code: str, tools: ProgramTools) -> RunOutcome:
        """Run one program with `tools` as its tool API; every failure comes back in the outcome."""
        from pydantic_monty import MontyCrashedError, MontyError, MontyRuntimeError, MontySyntaxError  # see _hold

        settings = self.settings
        printed = _Printed(settings.max_output_bytes)
        outcome = RunOutcome(tools=tools)
        started = time.perf_counter()
        pool = await self.pool()
        with anyio.move_on_after(settings.wall_seconds) as wall:
            try:
                session = pool.checkout(
                    script_name="program.py",
                    limits=self.limits(),
                    external_modules={"tools": tools.module()},
                    os_policy={"sleep_system_max": settings.wall_seconds},
                )
                async with session:
                    await session.feed_run("import tools\n")
                    outcome.checkout_ms = (time.perf_counter() - started) * 1000
                    outcome.value = await session.feed_run(
                        code, external_lookup={"call_tool": tools.call_tool}, print_callback=printed
                    )
            except MontySyntaxError as error:
                outcome.error = ProgramError("SyntaxError", error.display("msg"))
                frames = error.traceback()
                if frames:
                    outcome.error.line, outcome.error.source = frames[-1].line, frames[-1].source_line
            except MontyRuntimeError as error:
                outcome.error = _runtime_error(error)
            except MontyCrashedError as error:
                logger.warning("code mode: a sandbox worker died (%s); the pool replaces it", error)
                limit = CPU_LIMIT if error.timed_out else None
                outcome.error = ProgramError("SandboxCrashed", f"the sandbox worker running the program died: {error}")
                outcome.error.limit = limit
            except MontyError as error:
                outcome.error = ProgramError(type(error).__name__, str(error))
            except TimeoutError:  # no worker became free within the wall time
                outcome.error = ProgramError(
                    "TimeoutError",
                    f"no sandbox worker was free within {settings.wall_seconds:g} s (GATEWAY_CODEMODE__WORKERS "
                    "are all running programs)",
                    limit=WALL_LIMIT,
                )
        if outcome.error is not None and outcome.error.limit in _PLAIN:
            outcome.error.message = _PLAIN[outcome.error.limit](settings)
        if wall.cancelled_caught:
            outcome.value = None
            outcome.error = ProgramError(
                "TimeoutError",
                f"wall time limit: the program ran for more than {settings.wall_seconds:g} s, tool calls included",
                limit=WALL_LIMIT,
            )
        if tools.limit_hit is not None and (outcome.error is None or outcome.error.limit is None):
            outcome.value = None
            outcome.error = ProgramError(
                "RuntimeError",
                f"tool call limit: the program tried more than {tools.max_calls} tool calls",
                limit=tools.limit_hit,
            )
        outcome.output = printed.text()
        outcome.output_dropped = printed.dropped
        outcome.run_ms = (time.perf_counter() - started) * 1000
        return outcome
