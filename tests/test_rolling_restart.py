"""A rolling restart under load fails no call; a SIGKILLed replica fails at most its calls in flight.

Three `python -m gateway serve --transport http` replicas (stateless HTTP, each on a port of its
own that it gets back when restarted) serve one upstream, the demo server over streamable HTTP,
behind Debian's nginx: round robin, `proxy_next_upstream error timeout http_503 non_idempotent`
as docs/deployment.md configures it (tests/load_balancer.py, `resend=True`). Twenty sessions
call the demo's `sleep` tool (0.2 s, so calls are in flight on every replica at any moment) in a
loop through nginx. The sessions are bench/mcp_wire.py's raw-HTTP MCP sessions (handshake, then
`tools/call` POSTs on a kept-alive connection): twenty SDK clients would take most of a loaded
2-core machine by themselves. No PostgreSQL: the calls need no shared state and records are off.

Everything counts calls, nothing times them: a call fails when it raises or outlasts `CALL_BOUND`.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import httpx2
import pytest

from bench.mcp_wire import CallError, HttpSession
from tests.conftest import (
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    _read_line_with_prefix,
    free_port,
    gateway_env,
    start_demo_http,
    stop_process,
    write_config,
)
from tests.load_balancer import Balancer, start_balancer, stop_balancer

pytestmark = pytest.mark.anyio

SESSIONS = 20
TOOL, ARGUMENTS = "web__sleep", {"seconds": 0.2}
CALL_BOUND = 90.0
"""Seconds one call may take before it counts as failed: generous for a loaded CI machine."""
STEP_BOUND = 180.0
"""Seconds for one step (a replica's drain and exit, its start, a share of calls to complete)."""
DRAIN_WAITED = "draining: waiting up to"
"""What a replica logs when its drain waits for requests in flight (gateway/serving/drain.py)."""


@dataclass
class Replica:
    port: int
    home: Path
    process: subprocess.Popen[str] | None = None
    starts: int = 0

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.home / "gateway.log"


@dataclass
class Deployment:
    replicas: list[Replica]
    balancer: Balancer
    config: Path
    env: dict[str, str]
    plugins: Path

    def start(self, replica: Replica) -> None:
        """Start (or restart) `replica` on its own port; blocks until it serves (call in a thread)."""
        replica.starts += 1
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(self.config), "serve", "--transport", "http"]
            + ["--port", str(replica.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=gateway_env(replica.home, plugins_dir=self.plugins) | self.env,
            cwd=REPO,
        )
        assert process.stderr is not None
        with replica.log.open("a") as log:
            log.write(f"--- start {replica.starts}\n")
        _read_line_with_prefix(process.stderr, "mcp-gateway: serving on ", START_DEADLINE, process, replica.log)
        replica.process = process


def _wait(process: subprocess.Popen[str]) -> int:
    code = process.wait(timeout=STEP_BOUND)
    if process.stderr is not None:
        process.stderr.close()
    return code


async def _until_ready(replica: Replica) -> None:
    async with httpx2.AsyncClient(base_url=replica.base, timeout=30) as http:
        with anyio.fail_after(STEP_BOUND):
            while (await http.get("/readyz")).status_code != 200:
                await anyio.sleep(0.05)


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    upstream, url = start_demo_http("web")
    plugins = tmp_path / "plugins"  # no plugins: each (re)start stays cheap
    plugins.mkdir()
    config = write_config(tmp_path / "gateway.yaml", f'mcps:\n  web: {{url: "{url}"}}\n')
    env = NO_EMBEDDINGS | {
        "GATEWAY_HTTP__STATELESS": "true",
        "GATEWAY_RECORDS__ENABLED": "false",
        "GATEWAY_RELOAD__WATCH": "false",
        "GATEWAY_LOG_LEVEL": "INFO",
    }
    replicas = [Replica(free_port(), tmp_path / f"r{index}") for index in range(3)]
    found = Deployment(replicas, None, config, env, plugins)  # type: ignore[arg-type]
    try:
        for replica in replicas:
            replica.home.mkdir()
            found.start(replica)
        found.balancer = start_balancer([r.port for r in replicas], tmp_path / "nginx", resend=True)
        yield found
    finally:
        if found.balancer is not None:
            stop_balancer(found.balancer)
        for replica in replicas:
            if replica.process is not None:
                stop_process(replica.process)
        stop_process(upstream)


@dataclass(eq=False)  # compared by identity: which call, not what it holds
class Call:
    session: int
    done: bool = False
    error: str | None = None


@dataclass
class Load:
    """`SESSIONS` sessions through the balancer, each calling `TOOL` in a loop until `running` is false."""

    url: str
    calls: list[Call] = field(default_factory=list)
    running: bool = True
    _progress: anyio.Event = field(default_factory=anyio.Event)

    async def session(self, index: int) -> None:
        session = HttpSession(self.url)
        with anyio.fail_after(CALL_BOUND):
            await session.open()
        try:
            while self.running:
                call = Call(index)
                self.calls.append(call)
                try:
                    with anyio.fail_after(CALL_BOUND):
                        await session.call(TOOL, ARGUMENTS)
                except (CallError, OSError, TimeoutError) as exc:
                    call.error = f"{exc!r:.300}"
                call.done = True
                self._progress.set()
                self._progress = anyio.Event()
        finally:
            await session.close()

    def succeeded(self, since: int = 0) -> int:
        return sum(1 for call in self.calls[since:] if call.done and call.error is None)

    async def until_succeeded(self, count: int, since: int = 0) -> None:
        """Until `count` calls started at index `since` or later have succeeded (bounded)."""
        with anyio.fail_after(STEP_BOUND):
            while self.succeeded(since) < count:
                await self._progress.wait()

    def failures(self) -> list[Call]:
        return [call for call in self.calls if call.error is not None]


def _explain(load: Load, deployment: Deployment) -> str:
    errors = "\n".join(f"session {c.session}: {c.error}" for c in load.failures()[:20])
    logs = "\n".join(f"{r.port}:\n{r.log.read_text(errors='replace')[-1500:]}" for r in deployment.replicas)
    nginx = deployment.balancer.log[-2000:]
    return f"{len(load.failures())} of {len(load.calls)} calls failed:\n{errors}\nnginx:\n{nginx}\n{logs}"


async def test_a_rolling_restart_under_load_of_twenty_sessions_fails_no_call(deployment: Deployment) -> None:
    load = Load(f"{deployment.balancer.base}/mcp")
    drained_with_calls = 0
    async with anyio.create_task_group() as tg:
        for index in range(SESSIONS):
            tg.start_soon(load.session, index)
        await load.until_succeeded(2 * SESSIONS)
        for replica in deployment.replicas:
            assert replica.process is not None
            replica.process.send_signal(signal.SIGTERM)
            assert await anyio.to_thread.run_sync(_wait, replica.process) == 0, _explain(load, deployment)
            drained_with_calls += DRAIN_WAITED in replica.log.read_text(errors="replace").rsplit("--- start", 1)[-1]
            await anyio.to_thread.run_sync(deployment.start, replica)
            await _until_ready(replica)
            await load.until_succeeded(2 * SESSIONS, since=len(load.calls))  # calls go on through the restart
        load.running = False
    assert not load.failures(), _explain(load, deployment)
    assert drained_with_calls >= 1, "no replica had calls in flight when it drained: the test did not test the drain"
    print(f"rolling restart: {len(load.calls)} calls, 0 failed; {drained_with_calls} of 3 drains waited for calls")


async def test_a_sigkilled_replica_fails_at_most_its_calls_in_flight_and_nothing_after(
    deployment: Deployment,
) -> None:
    load = Load(f"{deployment.balancer.base}/mcp")
    victim = deployment.replicas[0]
    assert victim.process is not None
    async with anyio.create_task_group() as tg:
        for index in range(SESSIONS):
            tg.start_soon(load.session, index)
        await load.until_succeeded(2 * SESSIONS)
        # One event loop: no call starts or ends between the count and the kill.
        killed_at = len(load.calls)
        in_flight = [call for call in load.calls if not call.done]
        victim.process.kill()
        assert await anyio.to_thread.run_sync(_wait, victim.process) == -signal.SIGKILL
        await load.until_succeeded(3 * SESSIONS, since=killed_at)  # one replica fewer: calls go on
        load.running = False
    failed = load.failures()
    assert all(call in in_flight for call in failed), _explain(load, deployment)  # none started after the kill
    assert len(failed) <= len(in_flight) <= SESSIONS
    print(f"SIGKILL: {len(in_flight)} calls in flight, {len(failed)} failed, {load.succeeded(killed_at)} after it")
