"""The streamable-HTTP transport: the MCP endpoint, `POST /route`, `POST /feedback`, `GET /healthz`,
`/readyz`, `/metrics`, `/connect` (per-user OAuth links, `gateway.serving.connect`), `GET /` (a page
naming the endpoint and the console), the operator console
under `/admin` (`gateway.serving.admin`), the listening
socket and uvicorn.

Host and Origin headers are checked on every route against DNS rebinding: loopback
names always pass, others only when listed in `GATEWAY_HTTP__ALLOWED_HOSTS` /
`..._ORIGINS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import anyio
import anyio.to_thread
import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config.settings import Settings
from gateway.errors import GatewayError
from gateway.observability.health import is_ready
from gateway.observability.metrics import CONTENT_TYPE
from gateway.observability.tracing import TraceContextMiddleware
from gateway.observability.tracing import enabled as tracing_enabled
from gateway.records.feedback import feedback_endpoint
from gateway.router.query import cut_query
from gateway.security.auth import Authenticator
from gateway.security.http_guard import PUBLIC_PATHS, SecurityMiddleware, principal_in
from gateway.security.reachability import no_auth_refusal
from gateway.security.scopes import visible
from gateway.serving.admin.access import ADMIN_PREFIX, with_console
from gateway.serving.admin.api import api_routes
from gateway.serving.admin.ui import FAVICON_PATH, close_console, ui_routes
from gateway.serving.connect import CALLBACK_PATH, Connector, connect_routes
from gateway.serving.connections import guarded_protocol
from gateway.serving.deferred_responses import deferring_http_app
from gateway.serving.drain import Drain
from gateway.serving.exposure import GATEWAY_TOOL_NAMES, NO_TOOL_FITS, openai_function, tool_payload, unknown_mode
from gateway.serving.hot_front import HotFront
from gateway.serving.http_protocol import front_protocol
from gateway.serving.lean_path import LeanPath
from gateway.serving.server import GatewayServer

__all__ = [
    "METRICS_PATH",
    "bind_socket",
    "build_http_app",
    "index_endpoint",
    "loop_options",
    "metrics_endpoint",
    "open_sessions",
    "parser_protocol",
    "route_endpoint",
    "serve_http",
    "transport_security",
]

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
_LOOPBACK_HOSTS = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
_LOOPBACK_ORIGINS = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]


async def route_endpoint(gateway: GatewayServer, request: Request) -> Response:
    """`POST /route {"query": str, "k": int}`: the top-k tools in MCP and OpenAI form, with scores.

    Pinned tools follow the ranked ones (`"pinned": true`), as they are always offered. When
    the best tool scores under `routing.no_fit_threshold` (or the second stage's judge, through its
    chat endpoint, says none fits), the ranked tools are not offered:
    `"no_tool_fits": true`, a `message`, and the closest tools under `hints`.
    """
    try:
        body = await request.json()
    except ValueError:
        return _bad_request('The body must be JSON: {"query": "...", "k": 8}.')
    if not isinstance(body, dict):
        return _bad_request('The body must be a JSON object: {"query": "...", "k": 8}.')
    unknown = sorted(set(body) - {"query", "k"})
    if unknown:
        return _bad_request(f"Unknown field(s): {', '.join(unknown)}; the body takes `query` and `k`.")
    query, k = body.get("query"), body.get("k", gateway.settings.routing.k)
    if not isinstance(query, str) or not query.strip():
        return _bad_request("`query` must be a non-empty string.")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 50:
        return _bad_request(f"`k` must be an integer from 1 to 50; got {k!r}.")
    query = cut_query(query, gateway.settings.routing.max_query_chars)
    principal = principal_in(request)
    try:
        routing = await gateway.tools.route(query, k, principal)
    except GatewayError as exc:
        return JSONResponse({"error": exc.message}, status_code=503)
    catalog = gateway.registry.catalog.tools
    hits, fits = routing.hits, routing.fits
    hints = [] if fits else [tool_payload(hit) for hit in hits]
    if not fits:
        hits = []
    ranked = [(hit.record.tool, round(hit.score, 4), False) for hit in hits]
    seen = {hit.name for hit in hits}
    pinned = [
        (catalog[n].item, None, True)
        for n in gateway.settings.routing.pinned
        if n in catalog and n not in seen and visible(principal, catalog[n])
    ]
    tools = [
        {**tool.model_dump(by_alias=True, mode="json", exclude_none=True), "score": score, "pinned": is_pinned}
        for tool, score, is_pinned in ranked + pinned
    ]
    openai = [openai_function(tool) for tool, _, _ in ranked + pinned]
    answer: dict[str, Any] = {"query": query, "k": k, "tools": tools, "openai": openai}
    if hints:
        answer.update(no_tool_fits=True, message=NO_TOOL_FITS, hints=hints)
    return JSONResponse(answer)


async def metrics_endpoint(gateway: GatewayServer, request: Request) -> Response:
    """`GET /metrics`: the gateway's Prometheus metrics.

    Its labels name every server and tool, so behind authentication (unless
    `metrics_public`) only a caller without a profile, who may see everything, reads them.
    """
    principal = principal_in(request)
    if principal is not None and principal.profile is not None and not gateway.settings.http.metrics_public:
        refusal = {
            "error": "insufficient_scope",
            "error_description": f"{principal.name!r} has a profile; /metrics needs a key or token without one",
        }
        return JSONResponse(refusal, status_code=403)
    # Tens of milliseconds for a large catalog: off the event loop, which keeps serving calls.
    body = await anyio.to_thread.run_sync(gateway.registry.metrics.exposition)
    return Response(body, media_type=CONTENT_TYPE)


def index_endpoint(endpoint_path: str, *, console: bool) -> Callable[[Request], Awaitable[Response]]:
    """`GET /`: a page naming the MCP endpoint and the console, for whoever opens the bare address in a
    browser or with curl; a POST there (a client given the address without the path) is told the path."""
    links = [f'<li>MCP endpoint (streamable HTTP, for MCP clients): <a href="{endpoint_path}">{endpoint_path}</a></li>']
    if console:
        links.append(f'<li>Operator console: <a href="{ADMIN_PREFIX}">{ADMIN_PREFIX}</a></li>')
    links.append('<li>Health: <a href="/healthz">/healthz</a>, readiness: <a href="/readyz">/readyz</a></li>')
    page = (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>mcp-gateway</title></head><body>\n'
        "<h1>mcp-gateway</h1>\n<ul>\n" + "\n".join(links) + "\n</ul>\n</body></html>\n"
    )

    async def index(request: Request) -> Response:
        if request.method == "POST":
            message = f"This is not the MCP endpoint: send MCP requests to {endpoint_path}."
            return JSONResponse({"error": message}, status_code=404)
        return HTMLResponse(page)

    return index


def open_sessions(manager: StreamableHTTPSessionManager) -> int:
    """How many streamable-HTTP sessions are open. The SDK's session manager offers no public count;
    it keeps one transport per session id (mcp is pinned below 2.4, and a test reads this gauge)."""
    return len(manager._server_instances)


def _bad_request(message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=400)


def _refusing_unknown_modes(app: ASGIApp, endpoint_path: str) -> ASGIApp:
    """The MCP endpoint, with an unknown `?mode=` answered 400 before any MCP handling (`exposure.unknown_mode`)."""

    async def checked(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") == endpoint_path.rstrip("/"):
            refusal = unknown_mode(QueryParams(scope.get("query_string", b"")).getlist("mode"))
            if refusal is not None:
                await _bad_request(refusal)(scope, receive, send)
                return
        await app(scope, receive, send)

    return checked


def transport_security(settings: Settings) -> TransportSecuritySettings:
    """DNS-rebinding protection: loopback plus the configured hosts and origins, always on."""
    hosts = list(_LOOPBACK_HOSTS) + settings.http.allowed_hosts
    origins = list(_LOOPBACK_ORIGINS) + settings.http.allowed_origins
    host = settings.http.host
    if host not in ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::"):
        hosts.append(f"{host}:*")
        origins.append(f"http://{host}:*")
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins)


def build_http_app(gateway: GatewayServer, settings: Settings, *, admin: bool = True) -> SecurityMiddleware:
    """The MCP endpoint plus `POST /route` for host apps, behind `gateway.security.http_guard` (Host/Origin,
    authentication, rate limits, body size). `admin=False` leaves the operator console out (to measure
    what it costs a call: `bench/admin_overhead.py`)."""
    return _build_http_app(gateway, settings, admin=admin)[0]


def _build_http_app(
    gateway: GatewayServer, settings: Settings, *, admin: bool = True
) -> tuple[SecurityMiddleware, LeanPath | None]:
    """`build_http_app`, and its lean path (None: off), which the hot front serves (`hot_front`)."""
    security = transport_security(settings)
    guard = TransportSecurityMiddleware(security)
    gateway.stateless = settings.http.stateless
    if settings.http.stateless and settings.routing.mode == "dynamic":
        logger.warning(
            "GATEWAY_ROUTING__MODE=dynamic keeps found tools per session; under stateless HTTP there are "
            "none, so clients see it as `search`"
        )
    max_body = gateway.security.limits.max_request_bytes

    async def route(request: Request) -> Response:
        refused = await guard.validate_request(request, is_post=True)
        return refused if refused is not None else await route_endpoint(gateway, request)

    async def feedback(request: Request) -> Response:
        refused = await guard.validate_request(request, is_post=True)
        return refused if refused is not None else await feedback_endpoint(gateway.records, request)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = is_ready(gateway.registry.upstreams.values())
        status = 200 if ready else 503
        if gateway.auth.enabled and principal_in(request) is None:  # server names are for callers only
            return JSONResponse({"ready": ready}, status_code=status)
        servers = [gateway.registry.server_health(u) for u in gateway.registry.upstreams.values()]
        return JSONResponse({"ready": ready, "servers": servers}, status_code=status)

    async def metrics(request: Request) -> Response:
        return await metrics_endpoint(gateway, request)

    routes = [
        Route("/route", route, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
    ]
    if gateway.records is not None:
        routes.append(Route("/feedback", feedback, methods=["POST"]))
    if admin:
        routes += api_routes()  # the operator console's JSON API (docs/console.md)
        routes += ui_routes(gateway)  # the console's web pages at /admin (`gateway.serving.admin.ui`)
    public_paths: tuple[str, ...] = PUBLIC_PATHS
    if settings.http.path.rstrip("/"):  # `/` names the endpoint and the console (static: no Host check, no credentials)
        routes.append(Route("/", index_endpoint(settings.http.path, console=admin), methods=["GET", "POST"]))
        public_paths += ("/",)
    if admin:
        public_paths += (FAVICON_PATH,)  # an icon, asked for by browsers without credentials
    if settings.http.metrics:
        routes.append(Route(METRICS_PATH, metrics, methods=["GET"]))
        if settings.http.metrics_public:
            public_paths += (METRICS_PATH,)
    if any(u.spec.oauth is not None and u.spec.oauth.per_user for u in gateway.registry.upstreams.values()):
        # Per-user OAuth links; the provider's callback comes from a browser with no credentials.
        connector = Connector(gateway.registry, settings.oauth.public_url)
        gateway.tools.links = connector
        routes += connect_routes(connector)
        public_paths += (CALLBACK_PATH,)
    # The health routes skip the Host check and authentication (`http_guard.PUBLIC_PATHS`):
    # load balancers probe by IP address, without credentials.
    # `auto`: a JSON body for a quick answer; both modes: a hung-up client's request cancelled (`deferred_responses`)
    app: ASGIApp = deferring_http_app(
        gateway.server,
        path=settings.http.path,
        stateless=settings.http.stateless,
        security=security,
        max_request_body_size=max_body,
        session_idle_timeout=settings.http.session_idle_timeout,
        max_sessions=settings.http.max_sessions,
        max_sessions_per_client=settings.http.max_sessions_per_client,
        routes=list(routes),
        window=settings.http.response_window,
        json_first=settings.http.response_mode == "auto",
    )
    lean: LeanPath | None = None
    if settings.http.lean_path and settings.http.response_mode == "auto" and not settings.http.stateless:
        # the hot requests of an open session on the gateway's own path (`lean_path`)
        app = lean = LeanPath(
            app,
            gateway.server,
            gateway.server.session_manager,
            path=settings.http.path,
            window=settings.http.response_window,
            own_tools=GATEWAY_TOOL_NAMES,
            catalog=gateway.registry.catalog,
        )
    if not settings.http.stateless:
        gateway.registry.metrics.watch_sessions(partial(open_sessions, gateway.server.session_manager))
    authenticator = Authenticator(gateway.auth) if gateway.auth.enabled else None
    refusal = partial(no_auth_refusal, config=settings.config)  # without auth: to a request from beyond loopback
    served = _refusing_unknown_modes(app, settings.http.path)
    if tracing_enabled():  # a `traceparent` header continues the caller's trace
        served = TraceContextMiddleware(served)
    if admin:
        served = with_console(served, gateway)  # /admin requests find the console's sessions and state
    front = SecurityMiddleware(
        served,  # after the Host check and authentication
        guard=guard,
        auth=gateway.auth,
        endpoint_path=settings.http.path,
        max_body=max_body,
        authenticator=authenticator,
        public_paths=public_paths,
        session_prefix=ADMIN_PREFIX if admin else None,  # the console checks its own session cookie
        limiter=gateway.shared.limiter if gateway.shared is not None else None,  # replicas count together
        loopback_only=None if authenticator or settings.http.insecure_no_auth else refusal,
    )
    return front, lean


def parser_protocol(parser: str) -> type[asyncio.Protocol]:
    """uvicorn's protocol class for `http.parser`: httptools (`auto` where installed), or h11.
    Raises `ValueError` (a config error to the CLI) for `httptools` where it is not installed."""
    if parser in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        except ImportError:
            if parser == "httptools":
                raise ValueError(
                    "http.parser is httptools, and httptools is not installed: `pip install httptools`, "
                    "or set http.parser to auto or h11."
                ) from None
        else:
            return HttpToolsProtocol
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return H11Protocol


def loop_options(settings: Settings, transport: str) -> dict[str, Any]:
    """anyio's `backend_options` for serving over `transport`: uvloop for HTTP when `http.event_loop`
    asks for it (`auto`: where installed). Raises `ValueError` for `uvloop` where it is not installed."""
    choice = settings.http.event_loop
    if transport != "http" or choice == "asyncio":
        return {}
    try:
        import uvloop  # noqa: F401  # only whether it is there
    except ImportError:
        if choice == "uvloop":
            raise ValueError(
                "http.event_loop is uvloop, and uvloop is not installed (it has no Windows build): "
                "`pip install uvloop`, or set http.event_loop to auto or asyncio."
            ) from None
        return {}
    return {"use_uvloop": True}


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the CLI owns SIGINT/SIGTERM, so that the
    upstreams are shut down (and stdio children reaped) before the process exits."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def _stop_listening(server: uvicorn.Server, sock: socket.socket) -> None:
    """Accept no new connections (uvicorn's own shutdown closes its servers again, harmlessly).

    The bound socket is shut down first, while its descriptor is still open: closing the servers
    closes it, and uvloop serves on a duplicate of it, so closing alone would leave the kernel's
    socket listening wherever another descriptor of it lives, with new connections waiting in its
    backlog to be reset instead of being refused."""
    with contextlib.suppress(OSError):  # already closed, or never listening
        sock.shutdown(socket.SHUT_RDWR)
    for listening in server.servers:
        listening.close()
    sock.close()


def bind_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP listening socket before anything else starts, so a busy port is one clear error.

    Made for IPPROTO_TCP, not protocol 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only
    on connections accepted from such a socket, and without it every response waited about
    40 ms for the client's delayed ACK. Not inheritable (Python's default): no child process (a
    stdio upstream) is to hold the listening socket."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


async def serve_http(
    gateway: GatewayServer,
    settings: Settings,
    sock: socket.socket,
    *,
    stop: anyio.Event,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Serve streamable HTTP on an already bound socket until `stop` is set."""
    security, lean = _build_http_app(gateway, settings)
    app = drain = Drain(security)  # SIGTERM: readiness false, refuse new, finish
    # JSON logs: uvicorn's records go through the gateway's handler, not uvicorn's text formatter.
    log_config = None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG
    base = parser_protocol(settings.http.parser)
    if base.__name__ == "HttpToolsProtocol":  # hot requests past the outer layers, answers in one write
        front = None
        if lean is not None and security.screens_endpoint:
            front = HotFront(
                drain=drain,
                security=security,
                lean=lean,
                path=settings.http.path,
                max_body=gateway.security.limits.max_request_bytes,
            )
        base = front_protocol(front)
    protocol = guarded_protocol(
        base, settings.http.header_timeout, settings.http.max_connections_per_client
    )  # slow or silent connections closed, connections per address capped (`connections.py`)
    config = uvicorn.Config(
        app,
        http=protocol,
        ws="none",  # no WebSocket route: a WebSocket upgrade is answered as plain HTTP, and websockets is not imported
        timeout_keep_alive=settings.http.idle_timeout,  # type: ignore[arg-type]  # uvicorn types it int, takes a float
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=5,
        log_config=log_config,
    )
    if settings.http.trusted_proxies:  # else uvicorn's default: 127.0.0.1 (or $FORWARDED_ALLOW_IPS)
        config.forwarded_allow_ips = settings.http.trusted_proxies
    server = _Uvicorn(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve, [sock])
        while not server.started:  # uvicorn offers no readiness event
            if server.should_exit:
                return
            await anyio.sleep(0.02)
        port = sock.getsockname()[1]
        logger.info("serving MCP over HTTP on http://%s:%s%s", settings.http.host, port, settings.http.path)
        if ready is not None:
            ready(port)
        await stop.wait()
        await drain.drain(
            notice=settings.http.drain_notice_seconds,
            timeout=settings.http.drain_seconds,
            stop_listening=partial(_stop_listening, server, sock),
        )
        close_console(gateway)  # open live tails end, so uvicorn's graceful shutdown does not wait for them
        server.should_exit = True
