"""`mcp-gateway serve`: the gateway itself, over stdio or streamable HTTP, until stdin ends or a signal."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio

from gateway.calls.observed import ObservedCalls
from gateway.cli.common import EXIT_OK, Usage, load, settings_from
from gateway.cli.remote import remove_runtime, write_runtime
from gateway.collector import freeze_after_start
from gateway.config.loader import ConfigError, GatewayConfig
from gateway.config.security import AuthConfig
from gateway.config.settings import Settings, legacy_data_dir_notice
from gateway.malloc import fix_mmap_threshold
from gateway.observability.loop_watchdog import LoopWatchdog, Stall
from gateway.observability.tracing import Tracing, TracingUnavailable, start_tracing
from gateway.plugins import PluginManager, plugin_of_module
from gateway.records.redaction import Redactor
from gateway.records.service import Records, open_store
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router
from gateway.security.auth import Authenticator
from gateway.security.reachability import beyond_loopback, how_to_add_auth
from gateway.security.vetting import ToolVetter
from gateway.serving.admin.access import ADMIN_PREFIX
from gateway.serving.http import bind_socket, loop_options, parser_protocol, serve_http
from gateway.serving.reload import Reloader, watch_config
from gateway.serving.replication import follow
from gateway.serving.server import GatewayServer, serve_stdio
from gateway.state.deployment import SharedState

logger = logging.getLogger("gateway")

__all__ = ["add_parsers", "check_exposure", "run_serve"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve",
        help="serve the merged catalog over stdio or streamable HTTP",
        description="Serve the merged catalog in the foreground until Ctrl-C or SIGTERM (over stdio, also until "
        "stdin ends; SIGHUP reloads the config). Over HTTP the MCP endpoint is http://HOST:PORT/mcp and the "
        "operator console http://HOST:PORT/admin.",
    )
    serve.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio for a desktop client that starts the gateway itself, http to serve streamable HTTP "
        "(default: %(default)s)",
    )
    serve.add_argument("--host", help="HTTP bind address (default: $GATEWAY_HTTP__HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default: $GATEWAY_HTTP__PORT or 8765; 0 picks a free one)")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve HTTP on a non-loopback address with no authentication (anyone who can reach it may use it)",
    )
    serve.add_argument(
        "--mode",
        choices=["auto", "all", "search", "dynamic", "code"],
        help="tool exposure (default: $GATEWAY_ROUTING__MODE or auto)",
    )
    serve.set_defaults(run=run_serve)


def run_serve(args: argparse.Namespace, settings: Settings) -> int:
    notice = legacy_data_dir_notice(settings)  # before anything makes this deployment's data dir
    config, registry, pm, vetter = load(settings, serving=True)
    if notice is not None:
        logger.warning(notice)
    if args.transport == "http":
        check_exposure(settings, config.auth)
        parser_protocol(settings.http.parser)  # an `http.parser` that is not installed: a config error now
        Authenticator(config.auth)  # a broken JWKS file is a config error now, not at the first request
    fix_mmap_threshold()  # a large result must not raise the process's memory for good
    tracing = _start_tracing(settings, registry)
    try:
        reread = partial(_reread_settings, args)
        options = loop_options(settings, args.transport)  # uvloop for HTTP (`http.event_loop`)
        return anyio.run(
            _serve, registry, settings, args.transport, pm, config, vetter, reread, backend_options=options
        )
    finally:
        if tracing is not None:
            tracing.shutdown()  # export the spans still buffered


def _start_tracing(settings: Settings, registry: Registry) -> Tracing | None:
    """Tracing (`GATEWAY_TRACING__ENABLED`) and the call layer that tells traces and JSON logs what a call is."""
    try:
        tracing = start_tracing(settings.tracing, instance_id=settings.replica_id)
    except TracingUnavailable as exc:
        raise Usage(str(exc)) from None
    if tracing is not None or settings.log_format == "json":
        arguments = None
        if tracing is not None and settings.tracing.capture_arguments:
            redactor, limit = Redactor(settings.records.redact_keys), settings.records.max_argument_bytes

            def arguments(server: str, values: dict[str, Any] | None) -> str | None:
                return redactor.arguments_json(values, partial(registry.redact, server), limit)

        registry.observe_calls(ObservedCalls(arguments))
    return tracing


def check_exposure(settings: Settings, auth: AuthConfig) -> None:
    """Refuse to serve without authentication when the settings make the gateway reachable beyond
    loopback (`reachability.beyond_loopback`), unless told to (and then shout)."""
    reasons = beyond_loopback(settings.http)
    if auth.enabled or not reasons:
        return
    host = settings.http.host
    if not settings.http.insecure_no_auth:
        raise Usage(
            f"refusing to serve HTTP on {host} without authentication: {'; '.join(reasons)}, so anyone who can "
            "reach it could use every server behind the gateway. " + how_to_add_auth(settings.config)
        )
    banner = (
        f"WARNING: serving on {host} with NO AUTHENTICATION (insecure_no_auth) although {'; '.join(reasons)}: "
        "anyone who can reach it can use every tool"
    )
    print("!" * 20 + f"\n{banner}\n" + "!" * 20, file=sys.stderr, flush=True)
    logger.warning(banner)


def _reread_settings(args: argparse.Namespace) -> Settings:
    """The settings as `serve` read them at start (a reload compares them to say what needs a restart)."""
    try:
        return settings_from(args)
    except Usage as exc:
        raise ConfigError(Path(".env"), str(exc)) from None


async def _on_signals(stop: anyio.Event, hangup: Callable[[], None]) -> None:
    """SIGINT or SIGTERM ends serving gracefully: upstreams are closed and stdio children reaped.
    SIGHUP reloads the config (`gateway.serving.reload`)."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                hangup()
                continue
            logger.info("received %s; shutting down", signal.Signals(signum).name)
            stop.set()
            return


async def _serve(
    registry: Registry,
    settings: Settings,
    transport: str,
    pm: PluginManager,
    config: GatewayConfig,
    vetter: ToolVetter,
    settings_source: Callable[[], Settings],
) -> int:
    # Bind first: a busy port is reported before any server is started.
    sock = bind_socket(settings.http.host, settings.http.port) if transport == "http" else None
    stop = anyio.Event()
    watch_stop = anyio.Event()
    reloaders: list[Reloader] = []

    def hangup() -> None:
        if not reloaders:
            logger.warning("received SIGHUP before serving started; not reloading")
            return
        logger.info("received SIGHUP; reloading %s", settings.config)
        registry.task_group.start_soon(reloaders[0].reload, "sighup", name="reload")

    def announce(port: int) -> None:
        url = f"http://{settings.http.host}:{port}{settings.http.path}"
        write_runtime(settings, f"http://{_url_host(settings.http.host)}:{port}")  # for `servers restart`, `reload`
        print(f"mcp-gateway: serving on {url}", file=sys.stderr, flush=True)  # tests and benches wait for it
        console = f"http://{_url_host(settings.http.host)}:{port}{ADMIN_PREFIX}"  # where a browser here finds it
        print(f"mcp-gateway: console on {console} (Ctrl-C stops the gateway)", file=sys.stderr, flush=True)

    async with anyio.create_task_group() as tg:
        tg.start_soon(_on_signals, stop, hangup)
        records = _records(settings, registry)
        async with registry.running(), records.running() if records else contextlib.nullcontext():
            signals = records  # the router learns from the records (None: it does not)
            router = RouterService(registry, settings, lambda: build_router(settings, pm), signals)
            registry.task_group.start_soon(router.run, name="router")
            registry.task_group.start_soon(freeze_after_start, registry, router, settings, name="gc freeze")
            registry.task_group.start_soon(vetter.watch, registry.revet, name="approvals")
            gateway = GatewayServer(
                registry, settings, router, auth=config.auth, security=config.security, records=records
            )
            gateway.config, gateway.vetter = config, vetter  # for the operator console (`/admin`)
            if settings.loop_stall_threshold > 0:
                registry.task_group.start_soon(_loop_watchdog(pm, registry, settings).watch, name="loop watchdog")
            gateway.shared = _shared_state(settings)
            if gateway.shared is not None:  # replicas: apply the deployment's disables before serving
                await registry.task_group.start(follow, gateway, gateway.shared, name="shared state")
            plugin_names = [info.name for info in pm.infos]  # a failed plugin's section stays valid
            reloader = Reloader(
                registry, settings, pm, config, vetter, plugin_names=plugin_names, settings_source=settings_source
            )
            gateway.reloader = reloader
            reloaders.append(reloader)
            if settings.reload.watch:
                registry.task_group.start_soon(
                    watch_config, reloader, settings.reload.debounce_seconds, watch_stop, name="config watch"
                )
            try:
                if sock is None:
                    write_runtime(settings, None)  # `mcp-gateway reload` sends a stdio gateway SIGHUP
                    await serve_stdio(gateway, stop=stop)
                else:
                    await serve_http(gateway, settings, sock, stop=stop, ready=announce)
            finally:
                remove_runtime(settings)
                if gateway.shared is not None:
                    gateway.shared.close()
                watch_stop.set()  # before the watch is cancelled: its thread returns within a step
        tg.cancel_scope.cancel()
    return EXIT_OK


def _url_host(host: str) -> str:
    """Where a command on this machine reaches the gateway bound to `host`."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _shared_state(settings: Settings) -> SharedState | None:
    """The deployment's shared state when a PostgreSQL database is configured (`gateway.state`)."""
    url = settings.database_url
    if not url or not url.startswith(("postgresql://", "postgres://")):
        return None
    return SharedState.connect(url, settings.replica_id, settings.state_resync_seconds)


def _records(settings: Settings, registry: Registry) -> Records | None:
    """The records of a serving gateway (None when `GATEWAY_RECORDS__ENABLED=false`), in its call chain."""
    if not settings.records.enabled:
        return None
    records = Records(settings.records, open_store(settings), registry.redact)
    registry.record_calls(records.recorder)
    registry.metrics.watch_records_dropped(lambda: records.writer.dropped)
    return records


def _loop_watchdog(pm: PluginManager, registry: Registry, settings: Settings) -> LoopWatchdog:
    """The event-loop watchdog: a stall is logged naming the plugin code that held the loop, and counted."""

    def report(stall: Stall) -> None:
        logger.warning("event loop held for %.1f s by %s; every client waits", stall.seconds, stall.describe())
        registry.metrics.loop_stalls.labels(stall.plugin or "-").inc()

    return LoopWatchdog(plugin_of_module(pm), report, threshold=settings.loop_stall_threshold)
