"""Fault injection: real stdio children and HTTP servers that die, hang, lie or refuse.

Every test bounds its own time; the gateway (a `Registry`, or `python -m gateway serve`
driven by the SDK's client) must give the documented error, never hang, and keep
serving the servers that are fine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from gateway.calls import compose
from gateway.calls.breaker import CircuitBreaker, CircuitBreakers, refusal
from gateway.calls.timeout import apply_timeout
from gateway.config.loader import load_config
from gateway.config.runtime_settings import ResilienceSettings
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY, GatewayError, UpstreamTimeout, UpstreamUnavailable
from gateway.registry import Registry
from gateway.server_specs import specs_from_config
from gateway.upstreams import upstream as upstream_module
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    gateway_over_stdio,
    start_demo_http,
    start_gateway_http,
    stop_process,
    write_config,
)
from tests.test_calls import Script, make_call

pytestmark = pytest.mark.anyio

TINY_SERVER = REPO / "tests" / "servers" / "tiny_server.py"


def demo(name: str, *extra: str) -> str:
    """A YAML server entry running the demo server as a stdio child."""
    args = json.dumps([str(DEMO_SERVER), "stdio", "--name", name, *extra])
    return f"  {name}:\n    command: {sys.executable}\n    args: {args}\n"


@asynccontextmanager
async def running(
    tmp_path: Path, servers: str, *, startup_timeout: float = START_DEADLINE, **resilience: Any
) -> AsyncIterator[Registry]:
    config = load_config(write_config(tmp_path / "gateway.yaml", "mcps:\n" + servers))
    settings = Settings(
        data_dir=tmp_path / "data", startup_timeout=startup_timeout, resilience=ResilienceSettings(**resilience)
    )
    registry = Registry(specs_from_config(config), settings, relay_requests=False)
    async with registry.running():
        await registry.wait_settled(startup_timeout + 5)
        yield registry


async def call(registry: Registry, name: str, arguments: dict[str, Any]) -> types.CallToolResult | GatewayError:
    try:
        return await registry.call_tool(name, arguments)
    except GatewayError as exc:
        return exc


async def wait_for_lines(path: Path, count: int, timeout: float = START_DEADLINE) -> None:
    with anyio.fail_after(timeout):
        while not path.exists() or len(path.read_text().splitlines()) < count:
            await anyio.sleep(0.02)


def _text(result: types.CallToolResult | GatewayError) -> str:
    assert isinstance(result, types.CallToolResult), result
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


# ---- a server killed mid-call -------------------------------------------------------------


async def kill_mid_call(
    registry: Registry, tool: str, seconds: float, marker: Path
) -> types.CallToolResult | GatewayError:
    """Call `child__<tool>` (which marks its start in `marker`), SIGKILL the child once it has started."""
    child = registry.upstreams["child"]
    outcome: list[types.CallToolResult | GatewayError] = []

    async def run() -> None:
        outcome.append(await call(registry, f"child__{tool}", {"seconds": seconds, "marker": str(marker)}))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run)
        await wait_for_lines(marker, 1)
        assert child.pid is not None
        os.kill(child.pid, signal.SIGKILL)
    return outcome[0]


async def test_sigkill_mid_call_gives_outcome_unknown_once_and_the_next_call_works(tmp_path: Path) -> None:
    marker = tmp_path / "appended"
    with anyio.fail_after(60):
        async with running(tmp_path, demo("child") + demo("other")) as registry:
            error = await kill_mid_call(registry, "slow_append", 10, marker)
            assert _text(await call(registry, "other__echo", {"text": "still here"})) == "still here"

            assert isinstance(error, GatewayError) and error.code == "outcome_unknown"
            assert "'child'" in error.message and "may or may not have run" in error.message
            assert marker.read_text().splitlines() == ["start"]  # a non-idempotent tool never runs twice

            await registry.upstreams["child"].wait_ready(START_DEADLINE)
            assert _text(await call(registry, "child__echo", {"text": "back"})) == "back"
            assert registry.upstreams["other"].state == "ready"


async def test_an_idempotent_call_interrupted_by_sigkill_is_retried_after_the_restart(tmp_path: Path) -> None:
    marker = tmp_path / "lookups"
    with anyio.fail_after(60):
        async with running(tmp_path, demo("child"), retry_max_seconds=30) as registry:
            assert _text(await kill_mid_call(registry, "slow_lookup", 1, marker)) == "looked up in 1.0"
            assert marker.read_text().splitlines() == ["start", "start"]


async def test_sigkill_mid_call_through_the_gateway_reaches_the_client_as_an_error_result(tmp_path: Path) -> None:
    marker = tmp_path / "appended"
    config = write_config(tmp_path / "gateway.yaml", "mcps:\n" + demo("child"))
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path, NO_EMBEDDINGS) as client:
            pid = int(_text(await client.call_tool("child__pid", {})))
            outcome: list[types.CallToolResult] = []

            async def slow_append() -> None:
                outcome.append(await client.call_tool("child__slow_append", {"seconds": 10, "marker": str(marker)}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_append)
                await wait_for_lines(marker, 1)
                os.kill(pid, signal.SIGKILL)

            [result] = outcome
            assert result.is_error and result.meta is not None
            # The append ran before the kill: the model is told it may have, and to check, not to retry.
            assert result.meta[ERROR_META_KEY]["code"] == "outcome_unknown"
            assert result.meta[ERROR_META_KEY]["server"] == "child"
            text = _text(result)
            assert "may or may not have run" in text and "Check" in text and "try again" not in text
            with anyio.fail_after(30):
                while True:  # the restart takes a moment; the gateway says so until it is back
                    result = await client.call_tool("child__echo", {"text": "back"})
                    if not result.is_error:
                        break
                    await anyio.sleep(0.2)
            assert _text(result) == "back"


# ---- a server that hangs -------------------------------------------------------------------


async def test_a_hung_call_times_out_on_time_and_the_upstream_is_told_to_cancel(tmp_path: Path) -> None:
    marker = tmp_path / "cancelled"
    servers = demo("child") + "    tool_timeouts: {wait_for_*: 1}\n"
    with anyio.fail_after(60):
        async with running(tmp_path, servers) as registry:
            started = time.monotonic()
            error = await call(registry, "child__wait_for_cancel", {"marker": str(marker)})
            elapsed = time.monotonic() - started
            assert isinstance(error, GatewayError) and error.code == "upstream_timeout"
            # The limit the error names is the tool's (the default call timeout is 60 s), and it was
            # waited for; a hang is bounded by the fail_after. How soon a timeout ends a call is bench/'s.
            assert "within 1 s" in error.message and elapsed >= 1.0
            with anyio.fail_after(30):
                while not marker.exists():
                    await anyio.sleep(0.05)
            assert marker.read_text() == "cancelled"
            assert _text(await call(registry, "child__echo", {"text": "fine"})) == "fine"


# ---- servers that fail at start ------------------------------------------------------------


class _Failing500(BaseHTTPRequestHandler):
    status = 500

    def _fail(self) -> None:
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"internal error")

    do_GET = do_POST = do_DELETE = _fail

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def http_500_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Failing500)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()


class _Refusing401(_Failing500):
    status = 401


@pytest.fixture
def http_401_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing401)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/mcp"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_server_that_refuses_the_gateways_credentials_gives_upstream_unauthorized(
    tmp_path: Path, http_401_url: str, transport: str
) -> None:
    servers = (
        f"  remote:\n    url: {http_401_url}\n    transport: {transport}\n"
        "    headers: {Authorization: Bearer wrong-token-1234}\n"
    )
    with anyio.fail_after(30):
        async with running(tmp_path, servers, retry_attempts=1) as registry:
            remote = registry.upstreams["remote"]
            assert remote.unauthorized and "refused the gateway's credentials (HTTP 401)" in (remote.reason or "")
            with anyio.fail_after(10):
                while remote.state != "failed":  # between reconnection attempts
                    await anyio.sleep(0.05)
            error = await call(registry, "remote__anything", {})
            assert isinstance(error, GatewayError) and error.code == "upstream_unauthorized"
            assert "wrong-token-1234" not in error.message


def _refused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/mcp"


async def test_every_kind_of_broken_server_fails_alone_with_its_reason(tmp_path: Path, http_500_url: str) -> None:
    servers = (
        demo("healthy")
        + demo("garbage", "--misbehave", "garbage")
        + demo("quitter", "--misbehave", "exit")
        + demo("sluggish", "--misbehave", "slow", "--start-delay", "60")
        + f"  errors500:\n    url: {http_500_url}\n"
        + f"  refused:\n    url: {_refused_url()}\n"
    )
    with anyio.fail_after(60):
        async with running(tmp_path, servers, startup_timeout=10, retry_attempts=1) as registry:
            # A failed server is soon `starting` again (reconnecting), its reason carried along.
            states = {sid: (u.state, u.reason or "") for sid, u in registry.upstreams.items()}
            assert states.pop("healthy")[0] == "ready"
            assert all(state in ("failed", "starting") for state, _ in states.values()), states
            assert "not a JSON-RPC message: 'this is not JSON-RPC'" in states["garbage"][1]
            assert "missing API key" in states["quitter"][1]
            assert "within 10 s" in states["sluggish"][1]
            assert "HTTP 500" in states["errors500"][1]
            assert "onnect" in states["refused"][1]

            for sid in ("garbage", "quitter", "errors500", "refused"):
                error = await call(registry, f"{sid}__echo", {"text": "x"})
                assert isinstance(error, GatewayError) and error.code == "upstream_unavailable", sid
                assert repr(sid) in error.message, error.message
                assert "reconnects in" in error.message or "still connecting" in error.message
            assert _text(await call(registry, "healthy__echo", {"text": "ok"})) == "ok"


async def test_a_slow_starting_server_is_waited_for_within_the_startup_timeout(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running(tmp_path, demo("sluggish", "--misbehave", "slow"), startup_timeout=20) as registry:
            assert registry.upstreams["sluggish"].state == "ready"
            assert _text(await call(registry, "sluggish__echo", {"text": "late"})) == "late"


async def test_a_client_connects_while_a_server_starts_slower_than_the_sdk_waits_for_discover(tmp_path: Path) -> None:
    """The handshake waits for servers still connecting at most 8 s, whatever `GATEWAY_LIST_WAIT`
    says: the SDK's client gives `server/discover` 10 s, and a later answer locked it out."""
    config = write_config(
        tmp_path / "gateway.yaml", "mcps:\n" + demo("sluggish", "--misbehave", "slow", "--start-delay", "20")
    )
    env = NO_EMBEDDINGS | {"GATEWAY_LIST_WAIT": "60", "GATEWAY_STARTUP_TIMEOUT": "60"}
    with anyio.fail_after(90):
        async with gateway_over_stdio(config, tmp_path, env) as client:  # the SDK's `auto`: discover first
            assert client.session.discover_result is not None  # the 2026-07-28 protocol was negotiated
            names = {tool.name for tool in (await client.list_tools()).tools}  # the list waits for it
            assert "sluggish__echo" in names


# ---- processes ----------------------------------------------------------------------------------


def _live_descendants(root: int, known: frozenset[int] = frozenset()) -> list[int]:
    """Live (non-zombie) processes below `root`, from /proc.

    Processes below one of `known` are left out: another test in the same worker may have left a
    process running (a browser) that starts children of its own while this test runs.
    """
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z":
            parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent]
        found += children
        frontier += [pid for pid in children if pid not in known]
    return found


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "(gone)"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_a_hundred_kill_restart_cycles_leave_no_process_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstream_module, "RESTART_BACKOFF_BASE", 0.01)
    monkeypatch.setattr(upstream_module, "RESTART_BACKOFF_MAX", 0.05)
    pids = tmp_path / "pids"
    servers = (
        f"  tiny:\n    command: {sys.executable}\n"
        f"    args: {json.dumps([str(TINY_SERVER), '--grandchild', str(pids)])}\n    protocol: legacy\n"
    )
    before = frozenset(_live_descendants(os.getpid()))
    with anyio.fail_after(240):
        async with running(tmp_path, servers) as registry:
            tiny = registry.upstreams["tiny"]
            for cycle in range(100):
                await tiny.wait_ready(START_DEADLINE)
                assert tiny.pid is not None, cycle
                os.kill(tiny.pid, signal.SIGKILL)
                await wait_for_lines(pids, cycle + 2)  # the next incarnation has started
            await tiny.wait_ready(START_DEADLINE)
            assert _text(await call(registry, "tiny__echo", {"text": "alive"})) == "alive"
    spawned = [int(pid) for line in pids.read_text().splitlines() for pid in line.split()]
    assert len(spawned) >= 202  # 101 servers, each with a grandchild
    with anyio.fail_after(10):
        while any(_alive(pid) for pid in spawned):
            await anyio.sleep(0.05)
    # An incarnation started as the registry closed may not have written its pid yet: give any
    # process still exiting the same 10 s; one that stays is left behind.
    for _ in range(200):
        if set(_live_descendants(os.getpid(), before)) <= before:
            break
        await anyio.sleep(0.05)
    left = set(_live_descendants(os.getpid(), before)) - before
    assert not left, {pid: _command_line(pid) for pid in left}


# ---- secrets -------------------------------------------------------------------------------------


async def test_a_server_that_prints_its_credential_never_gets_it_into_a_reason_or_a_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "s3cr3t-t0ken-value"
    monkeypatch.setenv("GW_TEST_TOKEN", secret)
    leak = "import os, sys; print('auth failed for', os.environ['API_TOKEN'], file=sys.stderr); sys.exit(1)"
    servers = (
        f"  leaky:\n    command: {sys.executable}\n    args: {json.dumps(['-c', leak])}\n"
        "    credentials: {API_TOKEN_env: GW_TEST_TOKEN}\n"
    )
    caplog.set_level("DEBUG")
    with anyio.fail_after(30):
        async with running(tmp_path, servers, startup_timeout=10, retry_attempts=1) as registry:
            leaky = registry.upstreams["leaky"]
            assert "auth failed for ***" in (leaky.reason or "") and leaky.stderr_tail == ["auth failed for ***"]
            error = await call(registry, "leaky__anything", {})
            assert isinstance(error, GatewayError) and secret not in error.message
    assert secret not in caplog.text and "auth failed for ***" in caplog.text


async def test_an_http_upstream_that_restarts_with_new_sessions_is_reconnected_transparently(tmp_path: Path) -> None:
    process, url = start_demo_http("web")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    try:
        with anyio.fail_after(60):
            async with running(tmp_path, f"  web:\n    url: {url}\n", retry_max_seconds=30) as registry:
                assert _text(await call(registry, "web__echo", {"text": "one"})) == "one"
                stop_process(process)
                process, _ = start_demo_http("web", port=port)  # same address, no memory of our session
                assert _text(await call(registry, "web__echo", {"text": "two"})) == "two"
                web = registry.upstreams["web"]
                with anyio.fail_after(20):  # the new server got a session of its own (the call may come first)
                    while not (web.sessions >= 2 and web.state == "ready"):
                        await anyio.sleep(0.05)
    finally:
        stop_process(process)


# ---- on-demand start --------------------------------------------------------------------------


async def test_an_on_demand_server_idles_keeps_its_tools_listed_and_starts_on_the_next_call(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    servers = (
        f"  tiny:\n    command: {sys.executable}\n"
        f"    args: {json.dumps([str(TINY_SERVER), '--grandchild', str(starts)])}\n    protocol: legacy\n"
        "    start: on_demand\n    idle_timeout: 0.5\n"
    )
    with anyio.fail_after(60):
        async with running(tmp_path, servers) as registry:  # no saved listing yet: started once to list
            tiny = registry.upstreams["tiny"]
            assert "tiny__echo" in registry.catalog.tools
            with anyio.fail_after(10):
                while tiny.state != "idle":
                    await anyio.sleep(0.05)
            assert tiny.pid is None and "without calls" in (tiny.reason or "")
            assert "tiny__echo" in registry.catalog.tools  # still listed and searchable while idle
            assert _text(await call(registry, "tiny__echo", {"text": "woken"})) == "woken"
            assert tiny.state == "ready" and len(starts.read_text().splitlines()) == 2

        # A new gateway run lists it from the saved listing without starting it.
        async with running(tmp_path, servers) as registry:
            tiny = registry.upstreams["tiny"]
            assert tiny.state == "idle" and "tiny__echo" in registry.catalog.tools
            assert len(starts.read_text().splitlines()) == 2
            assert _text(await call(registry, "tiny__echo", {"text": "first"})) == "first"
            assert len(starts.read_text().splitlines()) == 3


async def test_a_server_that_stops_answering_pings_is_degraded_then_reconnected(tmp_path: Path) -> None:
    servers = (
        f"  tiny:\n    command: {sys.executable}\n    args: {json.dumps([str(TINY_SERVER)])}\n"
        "    protocol: legacy\n    timeout: 0.3\n    health_interval: 0.2\n"
    )
    with anyio.fail_after(60):
        async with running(tmp_path, servers) as registry:
            tiny = registry.upstreams["tiny"]
            frozen = tiny.pid
            assert frozen is not None
            os.kill(frozen, signal.SIGSTOP)  # alive, but answers nothing
            seen: set[str] = set()
            with anyio.fail_after(20):
                while not (tiny.state == "ready" and tiny.pid not in (None, frozen)):
                    seen.add(tiny.state)
                    await anyio.sleep(0.02)
            assert "degraded" in seen
            assert not _alive(frozen)  # the frozen child was killed, not left behind
            assert _text(await call(registry, "tiny__echo", {"text": "fresh"})) == "fresh"


async def test_health_probes_keep_a_healthy_server_ready_in_either_protocol_era(tmp_path: Path) -> None:
    servers = (
        demo("modern")
        + "    health_interval: 0.1\n"
        + demo("legacy")
        + "    protocol: legacy\n    health_interval: 0.1\n"
    )
    with anyio.fail_after(60):
        async with running(tmp_path, servers) as registry:
            modern, legacy = registry.upstreams["modern"], registry.upstreams["legacy"]
            assert modern.protocol_version != legacy.protocol_version
            changes = (modern.state_since, legacy.state_since)
            await anyio.sleep(1.0)  # about ten probes each
            assert (modern.state, legacy.state) == ("ready", "ready")
            assert (modern.state_since, legacy.state_since) == changes


# ---- recovery under load ----------------------------------------------------------------------------


async def _new_pid(pid_file: Path, old: int | None) -> int:
    """Wait until the stdio child (re)started and wrote its pid."""
    while True:
        text = pid_file.read_text() if pid_file.exists() else ""
        if text and int(text) != old:
            return int(text)
        await anyio.sleep(0.01)


async def test_under_load_a_sigkilled_stdio_server_is_restarted_and_every_later_call_succeeds(tmp_path: Path) -> None:
    """12 sessions keep calling a tool; the child is SIGKILLed twice, the second time as soon as it
    serves again (when the breaker used to be probing). Each time it is restarted and serves again,
    every call gets an answer, and once it serves, every later call succeeds: no breaker holds it
    back. The breakers' reset period outlasts the test, so only the new session with the restarted
    child can close a breaker the kill opened (a speed figure for this is bench/'s, not a test's)."""
    pid_file = tmp_path / "child.pid"
    config = write_config(tmp_path / "gateway.yaml", "mcps:\n" + demo("child", "--pid-file", str(pid_file)))
    env = NO_EMBEDDINGS | {"GATEWAY_RESILIENCE__BREAKER_RESET_SECONDS": "3600"}
    process, url = start_gateway_http(config, tmp_path, env)
    calls: list[bool | None] = []  # in the order they were sent: None while in flight, then whether it succeeded
    stop = anyio.Event()

    async def session() -> None:
        async with Client(url) as client:
            while not stop.is_set():
                index = len(calls)
                calls.append(None)
                result = await client.call_tool("child__echo", {"text": "hi"})
                calls[index] = not result.is_error
                await anyio.sleep(0.2)  # a steady stream of calls, not a synchronisation

    async def served_since(mark: int) -> None:
        """Until a call sent at `mark` or later succeeded."""
        while True not in calls[mark:]:
            await anyio.sleep(0.02)

    try:
        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(session)
                pid = await _new_pid(pid_file, None)
                await served_since(0)
                for _kill in range(2):
                    sent_after_the_kill = len(calls)
                    os.kill(pid, signal.SIGKILL)
                    pid = await _new_pid(pid_file, pid)  # restarted
                    await served_since(sent_after_the_kill)  # and serving again
                served_again = len(calls)
                while sum(ok is not None for ok in calls[served_again:]) < 3 * 12:  # three calls a session
                    await anyio.sleep(0.05)
                stop.set()
    finally:
        stop_process(process)
    assert None not in calls  # every call got an answer
    later = calls[served_again:]
    assert all(later), f"{later.count(False)} of {len(later)} calls failed after it served again"


async def test_calls_racing_a_sigkilled_servers_restart_never_get_a_json_rpc_internal_error(tmp_path: Path) -> None:
    """8 sessions call a tool 10 times a second each while the child is SIGKILLed. A grandchild in its own
    session holds the child's stderr open for a while (the gateway waits up to 0.5 s to read its last
    lines), so calls keep coming while the dead child's SDK client is closed: each is retried or an error
    result with its code, never a JSON-RPC error (the closed client's RuntimeError reached clients as -32603)."""
    pid_file = tmp_path / "child.pid"
    demo_child = f"{sys.executable} {DEMO_SERVER} stdio --name child --pid-file {pid_file}"
    script = f"setsid sleep 2 </dev/null >/dev/null & exec {demo_child}"
    config = write_config(
        tmp_path / "gateway.yaml", f"mcps:\n  child:\n    command: sh\n    args: {json.dumps(['-c', script])}\n"
    )
    # No breaker: every call of the window reaches the upstream (an open breaker refuses most of them).
    process, url = start_gateway_http(config, tmp_path, {"GATEWAY_RESILIENCE__BREAKER_FAILURES": "1000000"})
    calls: list[bool] = []  # succeeded
    json_rpc_errors: list[str] = []
    stop = anyio.Event()

    async def session() -> None:
        async with Client(url) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    result = await client.call_tool("child__echo", {"text": "hi"})
                except MCPError as error:
                    json_rpc_errors.append(f"{error.error.code}: {error.error.message}")
                else:
                    calls.append(not result.is_error)
                    if result.is_error:  # a gateway-made error a model can act on, with its code
                        assert isinstance((result.meta or {}).get(ERROR_META_KEY, {}).get("code"), str), result
                await anyio.sleep(max(0.0, 0.1 - (time.monotonic() - started)))

    async def served(count: int) -> None:
        since = len(calls)
        while calls[since:].count(True) < count:
            await anyio.sleep(0.02)

    try:
        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                for _ in range(8):
                    tg.start_soon(session)
                pid = await _new_pid(pid_file, None)
                await served(8)
                os.kill(pid, signal.SIGKILL)
                await _new_pid(pid_file, pid)
                await served(8)  # serving again
                stop.set()
    finally:
        stop_process(process)
    assert json_rpc_errors == []


# ---- the circuit breaker's recovery ----------------------------------------------------------------


def _opened(clock: list[float]) -> CircuitBreaker:
    breaker = CircuitBreaker(failures=3, reset_seconds=30, clock=lambda: clock[0])
    for _ in range(3):
        breaker.failed(breaker.admit())
    assert breaker.state == "open"
    return breaker


def test_a_fresh_session_with_the_server_closes_its_breaker_at_once() -> None:
    breakers = CircuitBreakers(failures=1, reset_seconds=30)
    breakers.session_started("s", 1)
    breaker = breakers.get("s")
    breaker.failed(breaker.admit())
    assert breakers.state("s") == "open"
    breakers.session_started("s", 1)  # the same session again (e.g. after a health check): no change
    assert breakers.state("s") == "open"
    breakers.session_started("s", 2)
    assert breakers.state("s") == "closed" and breaker.admit()


def test_late_failures_of_calls_sent_before_the_breaker_changed_do_not_count_again() -> None:
    clock = [0.0]
    breaker = CircuitBreaker(failures=3, reset_seconds=30, clock=lambda: clock[0])
    in_flight = [breaker.admit() for _ in range(5)]
    for admission in in_flight[:3]:
        breaker.failed(admission)
    assert breaker.state == "open" and breaker.consecutive == 3
    clock[0] = 20.0
    for admission in in_flight[3:]:  # the same outage, reported late: the breaker is not held longer
        breaker.failed(admission)
    assert breaker.consecutive == 3 and breaker.seconds_left() == 10
    clock[0] = 30.0
    probe = breaker.admit()
    assert probe is not None and breaker.admit() is None
    breaker.reconnected()  # a new session while the probe hangs on the old one: calls go again
    assert breaker.state == "closed" and breaker.admit()
    breaker.failed(probe)  # the old probe times out at last: it counts for nothing now
    assert breaker.state == "closed" and breaker.consecutive == 0


async def test_a_probe_that_times_out_opens_the_breaker_once_for_one_more_period() -> None:
    clock = [0.0]
    breakers = CircuitBreakers(failures=2, reset_seconds=30, clock=lambda: clock[0])
    chain = compose([breakers, apply_timeout])

    async def hang(arguments: Any) -> types.CallToolResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    for _ in range(2):
        with pytest.raises(UpstreamUnavailable):
            await chain(make_call(Script(UpstreamUnavailable("down", server="s"))))
    clock[0] = 30.0
    with pytest.raises(UpstreamTimeout):
        await chain(make_call(hang, timeout=0.05))
    breaker = breakers.get("s")
    assert breaker.state == "open" and breaker.consecutive == 3 and breaker.seconds_left() == 30


def test_the_refusal_says_when_the_next_attempt_is_made_and_never_0_s() -> None:
    clock = [0.0]
    breaker = _opened(clock)
    clock[0] = 29.8
    error = refusal("weather", breaker)
    assert "holding calls to it for 1 s more" in error.message and error.details["retry_after_seconds"] == 1
    clock[0] = 30.0
    assert breaker.admit() is not None  # due now: this call is the probe
    error = refusal("weather", breaker)
    assert "0 s" not in error.message and "one call is testing it right now" in error.message
    assert error.details["retry_after_seconds"] >= 1
