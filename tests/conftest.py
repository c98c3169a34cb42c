"""Shared fixtures: real upstream servers (in memory, stdio child, HTTP on 127.0.0.1) and gateways."""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from gateway.config.routing_settings import EmbeddingSettings
from gateway.config.settings import Settings

if TYPE_CHECKING:
    from gateway.router.embedder import FastEmbedEmbedder

REPO = Path(__file__).resolve().parent.parent
DEMO_SERVER = REPO / "tests" / "servers" / "demo_server.py"
FIXTURE_PLUGINS = REPO / "tests" / "fixtures" / "plugins"
EXAMPLE_CONFIG = REPO / "tests" / "fixtures" / "example-config.yaml"
"""The example `external-mcps.yaml` as the repository ships it. Tests copy this one, never the
repository's own file, which the README invites users to edit (change both together)."""

START_DEADLINE = 120.0
"""Seconds a test waits at most for a child process it starts (a server, a gateway, a CLI command) to
be up. It bounds a hang and measures nothing: CI's two cores are shared with busy neighbours, where a
start-up that takes one second alone can take twenty. How fast things start is bench/'s to say."""


ONE_WORKER_MODULES = frozenset(
    f"tests/{name}.py"
    for name in (
        "test_admin_api",  # a module fixture: one gateway whose audit log the tests read
        "test_caller_tokens",  # module fixtures: a gateway and the servers behind it
        "test_compat",  # session fixtures: the whole third-party matrix runs once, behind one gateway
        "test_console_ui",  # one gateway and one Chromium for the module, not one per worker
        "test_fuzz",  # and its last test checks what the others sent to that gateway
        "test_openapi_plugin",
        "test_packaging",  # a module fixture: the wheel and the fresh venv are built once
        "test_replicas",
        "test_router",  # module fixtures: routers with the whole test catalog embedded
        "test_security_http",
        "test_shared_state",  # three replicas, nginx and a PostgreSQL database for the module
    )
)
"""Test modules that one pytest-xdist worker runs whole: their module fixtures start once."""


LEAN_PATH_OFF = ("GATEWAY_LEAN_PATH",)
"""The one setting that turns the lean paths off: serving stdio and HTTP (`gateway.serving.stdio_lean`,
`gateway.serving.lean_path`) and forwarding calls upstream (`gateway.upstreams.lean_calls`)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lean-path",
        choices=("on", "off"),
        default="on",
        help="off: every gateway these tests start, in process or as a child, leaves every request to the "
        "SDK's session, over stdio and HTTP (GATEWAY_LEAN_PATH=false); the same tests must pass both ways",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n N` (xdist's `--dist load`): tests go one by one to whichever worker is free, except
    that each module of `ONE_WORKER_MODULES` goes to one worker whole (the biggest first).

    xdist's own `--dist loadgroup` with `xdist_group` marks would say this in the modules, but
    with pytest 9.2 it silently stops grouping (pytest-dev/pytest-xdist#1386).
    """
    if config.getoption("dist") != "load":
        return None  # another --dist was asked for
    from xdist.scheduler import LoadScopeScheduling

    class ModulesWhole(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER_MODULES else nodeid

    return ModulesWhole(config, log)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _private_data_dir(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[None]:
    """In-process commands keep their data (tool fingerprints, embedding cache) out of the user's home,
    and serve only the plugins of the directory a test names, not the installed built-ins. With
    `--lean-path off`, every gateway leaves every request to the SDK's session."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GATEWAY_DATA_DIR", str(tmp_path_factory.mktemp("data")))
        patch.setenv("GATEWAY_PLUGINS__ENTRY_POINTS", "false")
        if request.config.getoption("lean_path") == "off":
            for setting in LEAN_PATH_OFF:
                patch.setenv(setting, "false")
        yield


@pytest.fixture(scope="session")
def model_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data dir in which `embedder` assembled the bundled model."""
    return tmp_path_factory.mktemp("model-data")


@pytest.fixture(scope="session")
def embedder(model_data_dir: Path) -> FastEmbedEmbedder:
    """The bundled embedding model, loaded once for the session (once per xdist worker).

    Loading it takes about a second; tests that only embed with it share this one.
    """
    from gateway.router.embedder import FastEmbedEmbedder
    from gateway.router.model_loading import load_embedder

    loaded = load_embedder(EmbeddingSettings(), model_data_dir)
    assert isinstance(loaded, FastEmbedEmbedder), "the bundled embedding model must load"
    return loaded


async def call_plugin_tool(settings: Settings, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
    """Load the plugins `settings` point at, serve them in process, call one tool with the SDK client."""
    from gateway.plugins import get_plugin_manager
    from gateway.registry import Registry
    from gateway.server_specs import specs_from_plugins
    from gateway.serving.server import GatewayServer

    pm, _ = get_plugin_manager(settings)
    registry = Registry(specs_from_plugins(pm, settings), settings, plugins=pm)
    with anyio.fail_after(30):
        async with registry.running():
            gateway = GatewayServer(registry, settings)
            await registry.wait_settled()
            async with Client(gateway.server) as client:
                return await client.call_tool(tool, arguments)


def _drain(stream: IO[str], copy: Path | None = None) -> None:
    """Read a pipe to its end (into `copy` if given); the test closes it when it stops the child."""
    try:
        with open(copy or os.devnull, "a", encoding="utf-8") as sink:
            for line in stream:
                sink.write(line)
                sink.flush()
    except (ValueError, OSError):
        pass


def _read_line_with_prefix(
    stream: IO[str], prefix: str, timeout: float, process: subprocess.Popen[str], copy: Path | None = None
) -> str:
    """Read a child's pipe until a line starts with `prefix` (bounded), then keep draining it.

    The pipe is read with `os.read`, not `readline`: a buffered read can take several lines at
    once, and `select` would then wait for more while the awaited line sits in the buffer.
    Draining in a thread afterwards keeps a chatty child from blocking on a full pipe.
    """
    selector = selectors.DefaultSelector()
    selector.register(stream, selectors.EVENT_READ)
    seen: list[str] = []
    pending = b""
    end = time.monotonic() + timeout
    try:
        while time.monotonic() < end:
            if not selector.select(timeout=max(0.0, end - time.monotonic())):
                continue
            chunk = os.read(stream.fileno(), 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                raw, pending = pending.split(b"\n", 1)
                line = raw.decode("utf-8", errors="replace") + "\n"
                seen.append(line)
                if copy is not None:
                    with open(copy, "a", encoding="utf-8") as sink:
                        sink.write(line)
                if line.startswith(prefix):
                    if copy is not None and pending:
                        with open(copy, "a", encoding="utf-8") as sink:
                            sink.write(pending.decode("utf-8", errors="replace"))
                    threading.Thread(target=_drain, args=(stream, copy), daemon=True).start()
                    return line[len(prefix) :].strip()
    finally:
        selector.close()
    process.kill()
    raise RuntimeError(f"child did not print {prefix!r} within {timeout}s; it printed: {''.join(seen)[-2000:]}")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 at the moment of asking, for a server that must be told its port."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_demo_http(name: str = "web", transport: str = "http", port: int = 0) -> tuple[subprocess.Popen[str], str]:
    """Start the demo server over streamable HTTP (or SSE) on `port` (0: a free one); return it and its URL."""
    return start_script_http([str(DEMO_SERVER), transport, "--name", name, "--port", str(port)], transport)


def start_script_http(args: list[str], transport: str = "http") -> tuple[subprocess.Popen[str], str]:
    """Start a test server script that prints `PORT=<n>` once listening on 127.0.0.1; return it and its URL."""
    process = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    port = _read_line_with_prefix(process.stdout, "PORT=", START_DEADLINE, process)
    return process, f"http://127.0.0.1:{port}/{'mcp' if transport == 'http' else 'sse'}"


def stop_process(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


@pytest.fixture(scope="module")
def demo_http_url() -> Iterator[str]:
    """The demo server over streamable HTTP, shared by a module's tests (it starts in about a
    second of CPU): a test that changes its state (`grow`) starts its own with `start_demo_http`."""
    process, url = start_demo_http()
    try:
        yield url
    finally:
        stop_process(process)


def example_config(folder: Path) -> Path:
    """A pristine copy of the shipped example config, as `folder/external-mcps.yaml`."""
    folder.mkdir(parents=True, exist_ok=True)
    return Path(shutil.copy(EXAMPLE_CONFIG, folder / "external-mcps.yaml"))


def write_config(path: Path, body: str) -> Path:
    path.write_text(textwrap.dedent(body))
    return path


def demo_child_config(folder: Path) -> Path:
    """`folder/gateway.yaml` with one upstream: the demo server as a stdio child named `demo`."""
    return write_config(
        folder / "gateway.yaml",
        f"""
        mcps:
          demo:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, demo]
        """,
    )


NO_EMBEDDINGS = {"GATEWAY_EMBEDDING__ENABLED": "false"}
"""Extra environment for a gateway child whose test ranks no tools: the router uses BM25 alone.

Loading the embedding model and embedding the catalog costs a child about 1.7 s of CPU
in the background; a test that searches, ranks or reads the router's metrics keeps it.
"""


def gateway_env(tmp_path: Path, *, plugins_dir: Path = FIXTURE_PLUGINS) -> dict[str, str]:
    """Environment for a gateway child: its own data dir and the test plugin directory (its only plugins)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_") or k in LEAN_PATH_OFF}
    env.update(
        {
            "GATEWAY_DATA_DIR": str(tmp_path / "data"),
            "GATEWAY_PLUGINS__DIRECTORY": str(plugins_dir),
            "GATEWAY_PLUGINS__ENTRY_POINTS": "false",
            "GATEWAY_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(REPO),
        }
    )
    return env


def three_upstream_config(tmp_path: Path, http_url: str) -> Path:
    """A config with a stdio child and an HTTP server; the in-memory one comes from the fixture plugin."""
    return write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          child:
            description: the demo server as a stdio child process
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, child]
          web:
            description: the demo server over streamable HTTP
            url: {http_url}
        """,
    )


@asynccontextmanager
async def gateway_over_stdio(
    config: Path, tmp_path: Path, env: dict[str, str] | None = None, **client_kwargs: object
) -> AsyncIterator[Client]:
    """The SDK's client connected to `python -m gateway serve` over stdio."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"],
        env=gateway_env(tmp_path) | (env or {}),
        cwd=str(REPO),
    )
    async with Client(params, **client_kwargs) as client:  # type: ignore[arg-type]
        yield client


def start_gateway_http(
    config: Path, tmp_path: Path, env: dict[str, str] | None = None, log: Path | None = None
) -> tuple[subprocess.Popen[str], str]:
    """Start `python -m gateway serve --transport http` on a free port; return it and its URL.

    `log`: a file that receives everything the gateway writes on stderr (its log).
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=gateway_env(tmp_path) | (env or {}),
        cwd=REPO,
    )
    return process, _read_line_with_prefix(process.stderr, "mcp-gateway: serving on ", START_DEADLINE, process, log)


@asynccontextmanager
async def gateway_over_http(
    config: Path, tmp_path: Path, env: dict[str, str] | None = None, **client_kwargs: object
) -> AsyncIterator[Client]:
    """The SDK's client connected to the gateway over streamable HTTP on a free port."""
    process, url = start_gateway_http(config, tmp_path, env)
    try:
        async with Client(url, **client_kwargs) as client:  # type: ignore[arg-type]
            yield client
    finally:
        stop_process(process)
