"""The processes a load run drives (`bench/load.py`): upstream, gateways, FastMCP proxies, and
what `/proc` says of them (CPU, RSS, file descriptors, children).

Every process is started as the leader of its own process group and stopped, group and
all, by `Processes.stop()`. A gateway can be given a larger catalog (`catalog_tools`): an
in-memory plugin server with that many more tools, so that a cost that grows with the
catalog shows in the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.mcp_wire import HttpSession, Session, StdioConnection, StdioSession
from tests.conftest import DEMO_SERVER, FIXTURE_PLUGINS, NO_EMBEDDINGS, gateway_env, write_config

__all__ = [
    "Checkout",
    "add_checkout_option",
    "Processes",
    "Target",
    "children",
    "open_fds",
    "rss_mb",
    "start_targets",
]

REPO = Path(__file__).resolve().parent.parent
PROXY_SCRIPT = Path(__file__).with_name("fastmcp_proxy.py")
UPSTREAM_PROTOCOL = "    protocol: ${GATEWAY_BENCH_UPSTREAM_PROTOCOL:-auto}\n"
"""The upstream entry's `protocol`, `auto` unless a checkout's settings say otherwise
(`--gateway-checkout NAME=DIR,GATEWAY_BENCH_UPSTREAM_PROTOCOL=legacy`: the handshake era upstream)."""
NO_CALL_LIMIT = "security:\n  limits:\n    max_calls_per_session: null\n"
"""The gateway's config lifts its calls-per-session limit (10,000 by default): one stdio session
of a long run or a soak makes more calls than that, and a refusal is not what is measured."""
QUIET_ENV = {"FASTMCP_LOG_LEVEL": "WARNING", "FASTMCP_SHOW_SERVER_BANNER": "false"}
BULK_PLUGIN = '''
"""More tools for the gateway's catalog: a load run's `--catalog-tools`."""
from mcp.server.mcpserver import MCPServer

from gateway.hookspecs import hookimpl

COUNT = {count}


@hookimpl
def gateway_register_servers(register, settings):
    server = MCPServer("bulk")
    for i in range(COUNT):
        def tool(query: str, limit: int = 10) -> str:
            return query
        server.add_tool(tool, name=f"tool_{{i}}", description=f"Tool {{i}}: look up records about topic {{i}}.")
    register("bulk", server)
'''


# --- /proc ------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    """The live descendants of a process (children of every thread, then theirs)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tasks:
        try:
            kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for kid in map(int, kids):
            found += [kid, *children(kid)]
    return found


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# --- the targets: the processes of one path over one transport ---------------------------


@dataclass
class Target:
    transport: str
    path: str
    tool: str
    new_session: Callable[[], Session]
    roles: dict[str, int]
    """Process role (gateway, proxy, upstream) -> pid, whose CPU a cell reports."""

    @property
    def name(self) -> str:
        return f"{self.transport}/{self.path}"


@dataclass
class Processes:
    """Every process this run started (each the leader of its own process group), and their pipe readers."""

    started: list[asyncio.subprocess.Process] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def pids(self) -> list[int]:
        pids = [p.pid for p in self.started]
        return pids + [kid for pid in pids for kid in children(pid)]

    async def spawn(
        self, argv: list[str], env: dict[str, str], *, stdio: bool, cwd: Path = REPO
    ) -> asyncio.subprocess.Process:
        """Start `argv` in a new process group: stdin/stdout piped (stdio) or stdout and stderr piped."""
        pipe, devnull = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=pipe if stdio else devnull,
            stdout=pipe,
            stderr=devnull if stdio else pipe,
            env=env,
            cwd=cwd,
            start_new_session=True,
            limit=1 << 24,
        )
        self.started.append(process)
        return process

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*(_stop(process) for process in reversed(self.started)))


async def _stop(process: asyncio.subprocess.Process) -> None:
    """Close its stdin (an MCP server's cue to exit), then SIGTERM, then SIGKILL its process group."""
    if process.returncode is None and process.stdin is not None:
        process.stdin.close()
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        try:
            await asyncio.wait_for(process.wait(), 0.5 if sig is None and process.stdin is None else 5)
        except TimeoutError:
            continue
        break
    try:  # the group's other members (the upstream child) too, if any outlived their parent
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


async def _spawn_http(
    processes: Processes, argv: list[str], env: dict[str, str], prefix: str, cwd: Path = REPO
) -> tuple[int, str]:
    """Start an HTTP server that prints `prefix<rest>` on stdout or stderr once it listens; return pid and rest.

    Both pipes are drained after that, so a chatty server does not block on a full pipe."""
    process = await processes.spawn(argv, env, stdio=False, cwd=cwd)
    lines: asyncio.Queue[str] = asyncio.Queue()

    async def pump(stream: asyncio.StreamReader | None) -> None:
        while stream is not None and (line := await stream.readline()):
            lines.put_nowait(line.decode(errors="replace"))
        lines.put_nowait("")

    processes.tasks += [asyncio.create_task(pump(process.stdout)), asyncio.create_task(pump(process.stderr))]
    seen: list[str] = []
    eofs = 0
    async with asyncio.timeout(120):
        while eofs < 2:
            line = await lines.get()
            if line.startswith(prefix):
                return process.pid, line[len(prefix) :].strip()
            eofs += not line
            seen.append(line)
    raise RuntimeError(f"{argv[1:4]} exited without printing {prefix!r}: {''.join(seen)[-2000:]}")


def _demo_command(transport: str, name: str) -> list[str]:
    return [sys.executable, str(DEMO_SERVER), transport, "--name", name]


@dataclass(frozen=True)
class Checkout:
    """Where a gateway path's `python -m gateway` runs from: this repository, or another checkout
    (`--gateway-checkout NAME=DIR`, path `gateway@NAME`) with its own `.venv` if it has one, and the
    settings it runs with (`NAME=DIR,GATEWAY_X=value,...`: the same code under other settings)."""

    root: Path
    settings: tuple[tuple[str, str], ...] = ()

    @property
    def python(self) -> str:
        venv = self.root / ".venv" / "bin" / "python"
        return str(venv) if venv.exists() else sys.executable

    def env(self, base: dict[str, str]) -> dict[str, str]:
        extra = {"PYTHONPATH": str(self.root), **dict(self.settings)}
        if self.root != REPO:
            extra["PYTHONDONTWRITEBYTECODE"] = "1"  # leave the other checkout as it is
        return base | extra

    def command(self, config: Path, transport: str) -> list[str]:
        return [self.python, "-m", "gateway", "--config", str(config), "serve", "--transport", transport]


def _checkout_arg(text: str) -> tuple[str, Checkout]:
    name, sep, rest = text.partition("=")
    directory, *pairs = rest.split(",")
    root = Path(directory).resolve()
    settings = tuple(tuple(pair.split("=", 1)) for pair in pairs)
    if (
        not sep
        or not name.isidentifier()
        or not (root / "gateway" / "__main__.py").exists()
        or any(len(pair) != 2 or not pair[0].startswith("GATEWAY_") for pair in settings)
    ):
        raise argparse.ArgumentTypeError(f"{text!r}: NAME=DIR[,GATEWAY_X=value...], DIR a checkout of mcp-gateway")
    return name, Checkout(root, settings)  # type: ignore[arg-type]  # pairs of two, checked


def add_checkout_option(parser: argparse.ArgumentParser, help: str) -> None:
    """`--gateway-checkout NAME=DIR` (repeatable): `args.gateway_checkout` is a list of (NAME, Checkout)."""
    parser.add_argument(
        "--gateway-checkout", type=_checkout_arg, action="append", default=[], metavar="NAME=DIR", help=help
    )


async def _spawn_stdio(processes: Processes, argv: list[str], env: dict[str, str], cwd: Path = REPO) -> StdioConnection:
    process = await processes.spawn(argv, env, stdio=True, cwd=cwd)
    connection = StdioConnection(process)
    processes.tasks.append(connection.reader_task)
    await asyncio.wait_for(connection.open(), 120)
    return connection


def _env(workdir: Path, catalog_tools: int = 0) -> dict[str, str]:
    """The environment of every process it starts: a gateway's, with its own data dir under `workdir`
    and, with `catalog_tools`, a plugin directory whose `bulk` server adds that many tools."""
    workdir.mkdir(parents=True, exist_ok=True)
    if not catalog_tools:
        return gateway_env(workdir) | NO_EMBEDDINGS | QUIET_ENV
    plugins = workdir / "plugins"
    shutil.copytree(FIXTURE_PLUGINS, plugins, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    (plugins / "bulk").mkdir(exist_ok=True)
    (plugins / "bulk" / "__init__.py").write_text(BULK_PLUGIN.format(count=catalog_tools))
    return gateway_env(workdir, plugins_dir=plugins) | NO_EMBEDDINGS | QUIET_ENV


async def start_targets(
    transports: list[str],
    paths: list[str],
    workdir: Path,
    processes: Processes,
    checkouts: dict[str, Checkout],
    catalog_tools: int = 0,
    modern: bool = False,
    upstream_sse: bool = False,
) -> list[Target]:
    """Start the processes of every path over every transport; return the targets in `paths` order.

    `catalog_tools`: every gateway also serves that many more tools (an in-memory plugin server);
    `modern`: HTTP sessions speak 2026-07-28 (no handshake, no session) instead of 2025-11-25;
    `upstream_sse`: the HTTP paths' upstream speaks the legacy HTTP+SSE transport (no `direct` path:
    the load generator speaks streamable HTTP only)."""
    targets: list[Target] = []
    if "http" in transports:
        env = _env(workdir / "http")
        kind = "sse" if upstream_sse else "http"
        upstream, port = await _spawn_http(processes, _demo_command(kind, "up"), env, "PORT=")
        upstream_url = f"http://127.0.0.1:{port}/{'sse' if upstream_sse else 'mcp'}"
        upstream_entry = (
            f"mcps:\n  up:\n    url: {upstream_url}\n"
            + ("    transport: sse\n" if upstream_sse else "")
            + UPSTREAM_PROTOCOL
        )
        up = {"upstream": upstream}
        for path in paths:
            if path == "direct":
                if upstream_sse:
                    raise ValueError("path direct: the load generator speaks streamable HTTP, not HTTP+SSE")
                targets.append(Target("http", path, "echo", _http_factory(upstream_url, modern), dict(up)))
            elif path.startswith("gateway"):
                checkout = checkouts[path.partition("@")[2]]
                gw_dir = workdir / f"http-{path}"
                gw_env = checkout.env(_env(gw_dir, catalog_tools))
                config = write_config(gw_dir / "gw.yaml", upstream_entry + NO_CALL_LIMIT)
                argv = [*checkout.command(config, "http"), "--port", "0"]
                gateway, url = await _spawn_http(processes, argv, gw_env, "mcp-gateway: serving on ", checkout.root)
                targets.append(Target("http", path, "up__echo", _http_factory(url, modern), {"gateway": gateway} | up))
            else:
                fresh = ["--fresh"] if path.endswith("fresh") else []
                sse = ["--sse"] if upstream_sse else []
                argv = [sys.executable, str(PROXY_SCRIPT), "http", "--url", upstream_url, *fresh, *sse]
                proxy, port = await _spawn_http(processes, argv, env, "PORT=")
                url = f"http://127.0.0.1:{port}/mcp"
                targets.append(Target("http", path, "echo", _http_factory(url, modern), {"proxy": proxy} | up))
    if "stdio" in transports:
        for path in paths:
            is_gateway = path.startswith("gateway")
            env, cwd = _env(workdir / f"stdio-{path}", catalog_tools if is_gateway else 0), REPO
            if path == "direct":
                argv, tool, role = _demo_command("stdio", "up"), "echo", "upstream"
            elif is_gateway:
                checkout = checkouts[path.partition("@")[2]]
                command = _demo_command("stdio", "up")
                config = write_config(
                    workdir / f"stdio-{path}" / "gw.yaml",
                    f"mcps:\n  up:\n    command: {json.dumps(command[0])}\n    args: {json.dumps(command[1:])}\n"
                    + UPSTREAM_PROTOCOL
                    + NO_CALL_LIMIT,
                )
                argv, env, cwd = checkout.command(config, "stdio"), checkout.env(env), checkout.root
                tool, role = "up__echo", "gateway"
            else:
                fresh = ["--fresh"] if path.endswith("fresh") else []
                argv = [sys.executable, str(PROXY_SCRIPT), "stdio", *fresh, "--", *_demo_command("stdio", "up")]
                tool, role = "echo", "proxy"
            connection = await _spawn_stdio(processes, argv, env, cwd)
            await asyncio.wait_for(connection.call(tool, {"text": "warm"}), 60)
            roles = {role: connection.process.pid}
            if role != "upstream":
                child = _find_upstream(connection.process.pid)
                if child is not None:
                    roles["upstream"] = child
            targets.append(Target("stdio", path, tool, _stdio_factory(connection), roles))
    return targets


def _find_upstream(pid: int) -> int | None:
    """The demo server among a process's descendants (the gateway's or the proxy's stdio child)."""
    for kid in children(pid):
        try:
            if str(DEMO_SERVER).encode() in Path(f"/proc/{kid}/cmdline").read_bytes():
                return kid
        except OSError:
            continue
    return None


def _http_factory(url: str, modern: bool) -> Callable[[], Session]:
    return lambda: HttpSession(url, modern)


def _stdio_factory(connection: StdioConnection) -> Callable[[], Session]:
    return lambda: StdioSession(connection)
