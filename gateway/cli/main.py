"""`mcp-gateway` commands: serve, check, servers, tools, plugins, call, search, eval, stats.

Output is for people by default and for scripts with `--json`. A broken config is
one clear message on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import mcp_types as types
from pydantic import ValidationError

from gateway.cli.check_report import print_check, print_table, server_row
from gateway.config.loader import ConfigError, GatewayConfig, load_config
from gateway.config.security import AuthConfig
from gateway.config.settings import Settings, describe_settings_error
from gateway.errors import GatewayError, error_result
from gateway.plugins import PluginInfo, PluginManager, get_plugin_manager, plugin_directory
from gateway.records.service import SQLITE_FILE, Records, open_store
from gateway.records.store import RecordsError, RecordStore
from gateway.registry import (
    RegistrationError,
    Registry,
    check_plugin_sections,
    specs_from_config,
    specs_from_plugins,
)
from gateway.router.service import RouterService, build_router, learning_parameters, load_router_embedder
from gateway.security.auth import MIN_KEY_LENGTH, Authenticator, hash_key, new_key
from gateway.security.integrity import IntegrityStore
from gateway.security.vetting import ToolVetter
from gateway.serving.http import bind_socket, serve_http
from gateway.serving.server import GatewayServer, serve_stdio
from gateway.version import installed_version

__all__ = ["main"]

logger = logging.getLogger("gateway")

_LOOPBACK = ("127.0.0.1", "localhost", "::1")
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130
"""Last stderr lines of a failed server that `check` prints under its reason (`--json` has all that are kept)."""

T = TypeVar("T")


class _Usage(Exception):
    """A bad command line: message to stderr, exit 2."""


def _global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """--config and --log-level: given before the command or after it; the later one wins, as a repeated option."""
    parser.add_argument(
        "--config", type=Path, default=default, help="YAML server list (default: $GATEWAY_CONFIG or external-mcps.yaml)"
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default=default,
        help="default: $GATEWAY_LOG_LEVEL or INFO",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcp-gateway", description="One MCP endpoint in front of many MCP servers.")
    shown = installed_version() or "unknown (not installed)"  # run from a source tree never installed
    parser.add_argument("--version", action="version", version=f"mcp-gateway {shown}")
    _global_options(parser, default=None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="serve the merged catalog over stdio or streamable HTTP")
    serve.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    serve.add_argument("--host", help="HTTP bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8765; 0 picks a free one)")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve HTTP on a non-loopback address with no authentication (anyone who can reach it may use it)",
    )
    serve.add_argument(
        "--mode", choices=["all", "search", "dynamic"], help="tool exposure (default: $GATEWAY_ROUTING__MODE or all)"
    )

    for name, text in [
        ("check", "validate the config, connect to every server, print a status table; exit 1 if any failed"),
        ("servers", "connect and show every server with its state"),
        ("plugins", "list discovered plugins, with the traceback of any that failed to load"),
    ]:
        sub = commands.add_parser(name, help=text)
        sub.add_argument("--json", action="store_true", help="print JSON for scripts")

    tools = commands.add_parser("tools", help="list the merged tools, or approve a changed or quarantined one")
    tools.add_argument("action", nargs="?", choices=["list", "approve"], default="list")
    tools.add_argument("name", nargs="?", help="approve: the tool, as prefix__tool or server/tool")
    tools.add_argument("--server", help="only this server's tools")
    tools.add_argument("--json", action="store_true", help="print JSON for scripts")

    keys = commands.add_parser("keys", help="make API keys for `auth.api_keys` and hash existing ones")
    keys.add_argument("action", choices=["new", "hash"], help="new: a fresh key and its hash; hash: hash a key")
    keys.add_argument("key", nargs="?", help="hash: the key (default: read one line from stdin)")

    search = commands.add_parser("search", help="rank the live catalog's tools for a request")
    search.add_argument("query", help="the request, in plain words")
    search.add_argument("--k", type=int, default=None, help="how many tools (1-50; default $GATEWAY_ROUTING__K or 8)")
    search.add_argument("--json", action="store_true", help="print JSON for scripts")

    evaluate = commands.add_parser("eval", help="measure the router on a static catalog and queries")
    evaluate.add_argument("--catalog", type=Path, required=True, help="catalog JSON (LiveMCPBench format)")
    evaluate.add_argument("--queries", type=Path, required=True, help="queries JSONL with expected tools")
    evaluate.add_argument("--k", default="1,5,10", help="comma-separated cut-offs (default 1,5,10)")
    evaluate.add_argument("--json", action="store_true", help="print one JSON object, last on stdout")
    evaluate.add_argument(
        "--replay",
        action="store_true",
        help="also learn from simulated feedback on part of the queries; measure the rest without and with learning",
    )
    evaluate.add_argument(
        "--train-fraction", type=float, default=0.5, help="--replay: share of the queries trained on (default 0.5)"
    )
    evaluate.add_argument("--seed", type=int, default=0, help="--replay: first seed of the random splits (default 0)")
    evaluate.add_argument(
        "--repeats", type=int, default=5, help="--replay: splits averaged, seeds SEED, SEED+1, ... (default 5)"
    )

    scaffold = commands.add_parser("new-plugin", help="write a minimal plugin and its test, to start from")
    scaffold.add_argument("name", help="plugin name: lowercase letters, digits, '_' (also the tool prefix)")
    scaffold.add_argument(
        "--tests", type=Path, help="where its test goes (default: `tests` beside the plugin directory)"
    )

    stats = commands.add_parser("stats", help="calls, error rates and latencies per server and tool, from the records")
    stats.add_argument("--since", help="a duration back from now (30m, 24h, 7d) or an ISO date/time (default: all)")
    stats.add_argument("--json", action="store_true", help="print JSON for scripts")
    stats.add_argument("--csv", type=Path, metavar="DIR", help="also write executions, failures and feedback as CSV")

    call = commands.add_parser("call", help="call one tool and print its result")
    call.add_argument("tool", help="the exposed tool name, e.g. clock__now")
    call.add_argument("--args", default="{}", help="arguments as a JSON object")
    call.add_argument("--json", action="store_true", help="print the whole result as JSON")
    for command in commands.choices.values():  # unset after the command: keep what was given before it
        _global_options(command, default=argparse.SUPPRESS)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    try:
        settings = Settings()
    except ValidationError as exc:  # GATEWAY_* variables or .env
        raise _Usage(f"settings error: {describe_settings_error(exc)}") from None
    updates: dict[str, Any] = {}
    if args.config is not None:
        updates["config"] = args.config
    if args.log_level is not None:
        updates["log_level"] = args.log_level
    http_updates = {
        k: v for k, v in (("host", getattr(args, "host", None)), ("port", getattr(args, "port", None))) if v is not None
    }
    if http_updates:
        updates["http"] = settings.http.model_copy(update=http_updates)
    if getattr(args, "mode", None) is not None:
        updates["routing"] = settings.routing.model_copy(update={"mode": args.mode})
    return settings.model_copy(update=updates)


def _configure_logging(settings: Settings) -> None:
    # stderr only: stdout carries the MCP protocol under `serve --transport stdio`.
    logging.basicConfig(
        stream=sys.stderr, level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "mcp", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def _load(settings: Settings, *, serving: bool) -> tuple[GatewayConfig, Registry, PluginManager, ToolVetter]:
    config = load_config(settings.config)
    pm, infos = get_plugin_manager(settings)
    check_plugin_sections(config, [info.name for info in infos])
    specs = specs_from_plugins(pm, settings, config) + specs_from_config(config)
    # Only `serve` has a client to relay sampling, elicitation and roots requests to.
    registry = Registry(specs, settings, relay_requests=serving, plugins=pm)
    vetter = ToolVetter(IntegrityStore.in_dir(settings.data_dir), config.security)
    registry.listing_filter = vetter.vet
    registry.withheld = vetter.withheld
    return config, registry, pm, vetter


async def _with_registry(registry: Registry, body: Callable[[Registry], Awaitable[T]]) -> T:
    async with registry.running():
        await registry.wait_settled(registry.settings.startup_timeout + 5)
        return await body(registry)


async def _check(registry: Registry, as_json: bool, detailed: bool, vetter: ToolVetter) -> int:
    async def body(reg: Registry) -> list[dict[str, Any]]:
        return [server_row(u, reg) for u in reg.upstreams.values()]

    rows = await _with_registry(registry, body)
    failed = [r for r in rows if r["status"] not in ("ok", "disabled")]
    reports = sorted(vetter.reports.values(), key=lambda r: r.exposed)
    if as_json:
        findings = [{"tool": r.exposed, "server": r.server, "action": r.action, "findings": r.lines()} for r in reports]
        print(json.dumps({"servers": rows, "ok": not failed, "tool_findings": findings}, indent=2))
    else:
        print_check(rows, reports, detailed)
    return EXIT_FAILED if failed else EXIT_OK


def _approve(settings: Settings, name: str | None) -> int:
    """`tools approve NAME`: trust a tool's current definition (a change, or a quarantined description)."""
    store = IntegrityStore.in_dir(settings.data_dir)
    if not name:
        pending = ", ".join(t.exposed for t in store.pending()) or "none"
        raise _Usage(f"tools approve needs a tool name (prefix__tool or server/tool); changed tools: {pending}")
    found = store.find(name)
    if not found:
        raise _Usage(f"no tool {name!r} has been seen; run `mcp-gateway check` first, or give server/tool")
    for stored in found:
        store.approve(stored)
        print(f"approved {stored.exposed} (server {stored.server!r}, tool {stored.tool!r})")
    print("A running gateway uses it from the server's next tool-list change, or its restart.", file=sys.stderr)
    return EXIT_OK


async def _tools(registry: Registry, server: str | None, as_json: bool) -> int:
    if server is not None and server not in registry.upstreams:
        raise _Usage(f"unknown server {server!r}; servers: {', '.join(registry.upstreams) or 'none'}")

    async def body(reg: Registry) -> list[types.Tool]:
        return [e.item for e in reg.catalog.tools.values() if server is None or e.server_id == server]

    tools = await _with_registry(registry, body)
    if as_json:
        print(json.dumps([t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in tools], indent=2))
    else:
        print_table(
            [[t.name, (t.description or "").strip().split("\n")[0][:80]] for t in tools], ["TOOL", "DESCRIPTION"]
        )
    return EXIT_OK


async def _call(registry: Registry, tool: str, raw_args: str, as_json: bool) -> int:
    try:
        arguments = json.loads(raw_args)
    except json.JSONDecodeError as exc:
        raise _Usage(f"--args is not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise _Usage('--args must be a JSON object, like \'{"timezone": "Europe/Paris"}\'')

    owner = registry.owner_of(tool)
    async with registry.running():
        # Only the server that owns the tool matters: a slow or hanging other one must not delay the call.
        with anyio.move_on_after(registry.settings.startup_timeout + 5):
            if owner is not None:
                await owner.wait_settled()
            else:
                await registry.wait_settled()
        try:
            result = await registry.call_tool(tool, arguments)
        except GatewayError as exc:
            result = error_result(exc)
    if as_json:
        print(
            json.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True), indent=2, ensure_ascii=False)
        )
    else:
        for block in result.content:
            print(_describe_block(block))
    return EXIT_FAILED if result.is_error else EXIT_OK


async def _search(registry: Registry, pm: PluginManager, query: str, k: int | None, as_json: bool) -> int:
    settings = registry.settings
    k = settings.routing.k if k is None else k
    if not query.strip() or not 1 <= k <= 50:
        raise _Usage("search needs a non-empty QUERY and --k from 1 to 50")
    async with registry.running():
        await registry.wait_settled(settings.startup_timeout + 5)
        store = _recorded_store(settings)
        try:
            router = RouterService(registry, settings, lambda: build_router(settings, pm), store)
            router.router = await anyio.to_thread.run_sync(router.make_router)
            await router.sync()
            await router.refresh_signals()  # rank as the serving gateway does, with what it learnt
            hits = await router.search(query, k, settings.routing.threshold)
        finally:
            if store is not None:
                store.close()
    if as_json:
        print(json.dumps([{"name": h.name, "score": round(h.score, 4)} for h in hits], indent=2))
    elif not hits:
        print("No tool matches.")
    else:
        rows = [
            [str(i), h.name, f"{h.score:.3f}", (h.record.tool.description or "").strip().split("\n")[0][:70]]
            for i, h in enumerate(hits, 1)
        ]
        print_table(rows, ["#", "TOOL", "SCORE", "DESCRIPTION"])
    return EXIT_OK


@dataclass(frozen=True)
class _Replay:
    train_fraction: float
    seed: int
    repeats: int


def _eval(settings: Settings, catalog: Path, queries: Path, raw_ks: str, as_json: bool, replay: _Replay | None) -> int:
    from gateway.router.eval import format_report, load_catalog, load_queries, run_eval
    from gateway.router.replay import format_replay, run_replay

    try:
        ks = sorted({int(k) for k in raw_ks.split(",") if k.strip()})
    except ValueError:
        raise _Usage(f"--k takes comma-separated integers, like 1,5,10; got {raw_ks!r}") from None
    if not ks or any(not 1 <= k <= 50 for k in ks):
        raise _Usage("--k values must be from 1 to 50")
    for path in (catalog, queries):
        if not path.is_file():
            raise _Usage(f"no such file: {path}")
    if replay is not None and not 0 < replay.train_fraction < 1:
        raise _Usage("--train-fraction must be between 0 and 1 (both excluded)")
    if replay is not None and not 1 <= replay.repeats <= 100:
        raise _Usage("--repeats must be from 1 to 100")
    pm, _ = get_plugin_manager(settings)
    embedder = load_router_embedder(settings, pm)
    report = run_eval(catalog, queries, ks, embedder, threshold=settings.routing.threshold)
    print(format_report(report))
    figures = report.to_json()
    if replay is not None:
        try:
            replayed = run_replay(
                load_catalog(catalog),
                load_queries(queries),
                ks,
                embedder,
                learning=learning_parameters(settings.learning),
                train_fraction=replay.train_fraction,
                seeds=range(replay.seed, replay.seed + replay.repeats),
                threshold=settings.routing.threshold,
            )
        except ValueError as exc:
            raise _Usage(f"--replay: {exc}") from None
        print(format_replay(replayed))
        figures["replay"] = replayed.to_json()
    if as_json:
        print(json.dumps(figures))
    return EXIT_OK


def _describe_block(block: types.ContentBlock) -> str:
    """A content block for a person: text as is, binary content as a one-line summary."""
    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.type}: {block.mime_type}, {len(block.data) * 3 // 4} bytes]"
    if isinstance(block, types.ResourceLink):
        return f"[resource link: {block.uri}]"
    if isinstance(block, types.EmbeddedResource):
        contents = block.resource
        if isinstance(contents, types.TextResourceContents):
            return f"[resource {contents.uri}]\n{contents.text}"
        return f"[resource {contents.uri}: {contents.mime_type or 'binary'}]"
    return json.dumps(block.model_dump(by_alias=True, mode="json", exclude_none=True))


def _plugins(infos: list[PluginInfo], as_json: bool) -> int:
    if as_json:
        print(json.dumps([i.__dict__ for i in infos], indent=2))
        return EXIT_OK
    if not infos:
        print("No plugins found.")
    print_table([[i.name, i.status, i.source] for i in infos], ["PLUGIN", "STATUS", "SOURCE"])
    for info in infos:
        if info.note:
            print(f"  {info.name} ({info.source}): {info.note}")
    for info in infos:
        if info.error:
            print(f"\n{info.name} failed to load:\n{info.error}")
    return EXIT_OK


def _keys(action: str, key: str | None) -> int:
    """`keys new` prints a fresh key and its hash; `keys hash` hashes a key (argument or stdin)."""
    if action == "new":
        key = new_key()
        print(f"key:  {key}\nhash: {hash_key(key)}")
        print("Give the key to its holder; put only the hash in auth.api_keys.", file=sys.stderr)
        return EXIT_OK
    key = (key if key is not None else sys.stdin.readline()).strip()
    if not key:
        raise _Usage("keys hash needs a key (as an argument or one line on stdin)")
    if len(key) < MIN_KEY_LENGTH:
        print(f"warning: a key under {MIN_KEY_LENGTH} characters can be guessed; use `keys new`", file=sys.stderr)
    print(hash_key(key))
    return EXIT_OK


def check_exposure(host: str, auth: AuthConfig, *, insecure: bool) -> None:
    """Refuse to serve a non-loopback address without authentication, unless told to (and then shout)."""
    if auth.enabled or host in _LOOPBACK:
        return
    if not insecure:
        raise _Usage(
            f"refusing to serve HTTP on {host} without authentication: anyone who can reach it could use every "
            "server behind the gateway. Configure auth.api_keys or auth.jwt (see docs/security.md), "
            "or pass --insecure-no-auth if something in front of the gateway authenticates callers."
        )
    banner = (
        f"WARNING: serving on {host} with NO AUTHENTICATION (--insecure-no-auth): "
        "anyone who can reach it can use every tool"
    )
    print("!" * 20 + f"\n{banner}\n" + "!" * 20, file=sys.stderr, flush=True)
    logger.warning(banner)


async def _exit_on_signal(stop: anyio.Event) -> None:
    """SIGINT or SIGTERM ends serving gracefully: upstreams are closed and stdio children reaped."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            logger.info("received %s; shutting down", signal.Signals(signum).name)
            stop.set()
            return


async def _serve(
    registry: Registry, settings: Settings, transport: str, pm: PluginManager, config: GatewayConfig, vetter: ToolVetter
) -> int:
    # Bind first: a busy port is reported before any server is started.
    sock = bind_socket(settings.http.host, settings.http.port) if transport == "http" else None
    stop = anyio.Event()

    def announce(port: int) -> None:
        url = f"http://{settings.http.host}:{port}{settings.http.path}"
        print(f"mcp-gateway: serving on {url}", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(_exit_on_signal, stop)
        records = _records(settings, registry)
        async with registry.running(), records.running() if records else contextlib.nullcontext():
            signals = records.store if records is not None else None  # the router learns from the records
            router = RouterService(registry, settings, lambda: build_router(settings, pm), signals)
            registry.task_group.start_soon(router.run, name="router")
            registry.task_group.start_soon(vetter.watch, registry.revet, name="approvals")
            gateway = GatewayServer(
                registry, settings, router, auth=config.auth, security=config.security, records=records
            )
            if sock is None:
                await serve_stdio(gateway, stop=stop)
            else:
                await serve_http(gateway, settings, sock, stop=stop, ready=announce)
        tg.cancel_scope.cancel()
    return EXIT_OK


def _recorded_store(settings: Settings) -> RecordStore | None:
    """The records a serving gateway learns from, for one-shot commands; None if there are none yet."""
    if not (settings.records.enabled and settings.learning.enabled):
        return None
    if settings.database_url is None and not (settings.data_dir / SQLITE_FILE).exists():
        return None
    return open_store(settings)


def _records(settings: Settings, registry: Registry) -> Records | None:
    """The records of a serving gateway (None when `GATEWAY_RECORDS__ENABLED=false`), in its call chain."""
    if not settings.records.enabled:
        return None
    records = Records(settings.records, open_store(settings), registry.redact)
    registry.record_calls(records.recorder)
    registry.metrics.watch_records_dropped(lambda: records.writer.dropped)
    return records


def _stats(settings: Settings, since_text: str | None, as_json: bool, csv_dir: Path | None) -> int:
    """`stats`: read the records (SQLite in the data dir, or GATEWAY_DATABASE_URL)."""
    from gateway.records.stats import compute_stats, executions_for_stats, export_csv, format_stats, parse_since

    try:
        since = parse_since(since_text, time.time()) if since_text else None
    except ValueError as exc:
        raise _Usage(str(exc)) from None
    store = open_store(settings)
    try:
        servers = compute_stats(executions_for_stats(store, since))
        exported = export_csv(store, csv_dir, since) if csv_dir is not None else []
    except RecordsError as exc:
        print(f"mcp-gateway: cannot read the records: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    if as_json:
        body = {"store": store.description, "since": since, "servers": [s.to_json() for s in servers]}
        body["csv"] = [{"path": str(path), "rows": rows} for path, rows in exported]
        print(json.dumps(body, indent=2))
    else:
        print(format_stats(servers))
        for path, rows in exported:
            print(f"wrote {path} ({rows} rows)", file=sys.stderr)
    return EXIT_OK


def _new_plugin(settings: Settings, name: str, tests: Path | None) -> int:
    """Write the plugin into the directory the gateway searches (beside the config), its test next to it."""
    from gateway.cli.scaffold import ScaffoldError, new_plugin

    plugins = plugin_directory(settings)
    try:
        written = new_plugin(name, plugins, tests or plugins.parent / "tests")
    except ScaffoldError as exc:
        raise _Usage(str(exc)) from None
    for path in written:
        print(f"wrote {path}")
    print(
        f"next: `mcp-gateway --config {settings.config} tools --server {name}` lists its tool; "
        f"`python -m pytest {written[1]}`, run in {plugins.parent}, runs its test"
    )
    return EXIT_OK


def run(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run one command, return its exit code."""
    args = _parser().parse_args(argv)
    try:
        settings = _settings(args)
        _configure_logging(settings)
        if args.command == "plugins":
            _, infos = get_plugin_manager(settings)
            return _plugins(infos, args.json)
        if args.command == "eval":
            replay = _Replay(args.train_fraction, args.seed, args.repeats) if args.replay else None
            return _eval(settings, args.catalog, args.queries, args.k, args.json, replay)
        if args.command == "new-plugin":
            return _new_plugin(settings, args.name, args.tests)
        if args.command == "keys":
            return _keys(args.action, args.key)
        if args.command == "stats":
            return _stats(settings, args.since, args.json, args.csv)
        if args.command == "tools" and args.action == "approve":
            return _approve(settings, args.name)
        config, registry, pm, vetter = _load(settings, serving=args.command == "serve")
        if args.command in ("check", "servers"):
            return anyio.run(_check, registry, args.json, args.command == "servers", vetter)
        if args.command == "tools":
            return anyio.run(_tools, registry, args.server, args.json)
        if args.command == "call":
            return anyio.run(_call, registry, args.tool, args.args, args.json)
        if args.command == "search":
            return anyio.run(_search, registry, pm, args.query, args.k, args.json)
        if args.transport == "http":
            check_exposure(settings.http.host, config.auth, insecure=args.insecure_no_auth)
            Authenticator(config.auth)  # a broken JWKS file is a config error now, not at the first request
        return anyio.run(_serve, registry, settings, args.transport, pm, config, vetter)
    except ConfigError as exc:
        print(f"mcp-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except ValueError as exc:  # a JWKS file that cannot be read
        print(f"mcp-gateway: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (RegistrationError, _Usage) as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except OSError as exc:
        print(f"mcp-gateway: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def main() -> None:
    sys.exit(run())
