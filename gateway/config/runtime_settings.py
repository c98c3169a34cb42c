"""The settings sections of how the gateway runs: its HTTP transport, plugins, upstreams and their
resilience, records, tracing, live reload and OAuth (`GATEWAY_HTTP__*`, `GATEWAY_UPSTREAMS__*`...).

Apart from `gateway.config.settings` so `Settings` stays a short list of what the gateway is made
of, and each section is found by the part of the gateway it configures."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr

__all__ = [
    "DEFAULT_REDACT_KEYS",
    "HttpSettings",
    "OAuthSettings",
    "PluginSettings",
    "RecordsSettings",
    "ReloadSettings",
    "ResilienceSettings",
    "TracingSettings",
    "UpstreamSettings",
]


class HttpSettings(BaseModel):
    """The downstream streamable-HTTP transport."""

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    path: str = "/mcp"
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Extra Host header values accepted besides loopback ones (DNS-rebinding guard).",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Extra Origin header values accepted besides loopback ones (DNS-rebinding guard).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses (or CIDR networks) of reverse proxies whose X-Forwarded-For and X-Forwarded-Proto headers "
            "are believed (the client address logged and checked becomes the one they name); unset: "
            "uvicorn's default, 127.0.0.1. Setting it says the gateway is reachable beyond loopback, so it "
            "needs `auth:`."
        ),
    )
    insecure_no_auth: bool = Field(
        default=False,
        description=(
            "Serve without `auth:` although the gateway is reachable beyond loopback (a non-loopback bind "
            "address, allowed hosts or origins, trusted proxies, or a proxied request): only when something "
            "in front of it authenticates every caller. Same as `serve --insecure-no-auth`."
        ),
    )
    stateless: bool = Field(
        default=False,
        description="Serve without sessions, so replicas behind a load balancer need no session affinity.",
    )
    session_idle_timeout: float = Field(
        default=1800.0,
        gt=0,
        le=7 * 24 * 3600,
        description=(
            "Seconds a handshake-era session may go without any request in flight (an open GET stream "
            "counts as one) before the gateway closes it: a client that went away without DELETE does "
            "not hold its session for ever."
        ),
    )
    max_sessions: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description=(
            "Most handshake-era sessions open at once; a new one beyond it is answered 503 until one "
            "closes (2026-07-28 clients have no sessions and are not counted)."
        ),
    )
    max_sessions_per_client: int = Field(
        default=100,
        ge=1,
        le=1_000_000,
        description=(
            "Most handshake-era sessions one client (an API key or JWT subject; without auth, an address) holds "
            "at once; one more is answered 503, so one client cannot take every one of max_sessions."
        ),
    )
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        le=3600,
        description=(
            "Seconds a connection may take to send a request's headers (its first, or the next one after a "
            "response) before it is answered 408 and closed: a slow or silent client holds no connection."
        ),
    )
    idle_timeout: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description="Seconds a keep-alive connection may sit idle between requests before it is closed.",
    )
    max_connections_per_client: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description=(
            "Most connections one address holds at once; a new one beyond it is answered 503 and closed. "
            "Behind a proxy every client has the proxy's address: raise it there, and cap at the proxy."
        ),
    )
    response_mode: Literal["auto", "sse"] = Field(
        default="auto",
        description=(
            "How a POSTed request of a handshake-era client is answered. `auto`: a JSON body when the answer "
            "is the first thing the request has within `response_window` seconds, else an SSE stream with "
            "every progress, log or server request, pings and the answer (less CPU per call). `sse`: always "
            "an SSE stream, for a client that mishandles a JSON answer."
        ),
    )
    response_window: float = Field(
        default=15.0,
        gt=0,
        le=300,
        description=(
            "Seconds a request may run silent before its answer becomes an SSE stream (`response_mode: "
            "auto`), and between pings on that stream: no client waits longer than this without bytes."
        ),
    )
    lean_path: bool = Field(
        default=True,
        description=(
            "Serve the hot requests of a session (`tools/call`, `tools/list`, `resources/read`, `prompts/get`) "
            "on the gateway's own path in front of the SDK's transport (`gateway.serving.lean_path`: "
            "less CPU per call, the same answers); `false` leaves every request to the SDK. Used with "
            "`response_mode: auto` and sessions (not `stateless`)."
        ),
    )
    parser: Literal["auto", "httptools", "h11"] = Field(
        default="auto",
        description=(
            "The HTTP/1.1 parser: `httptools` (C, llhttp; the gateway's own protocol on it, which serves a "
            "session's hot requests past the app's outer layers and writes each answer in one write), `h11` "
            "(pure Python, uvicorn's protocol), or `auto`: httptools where it is installed (it is a dependency), "
            "else h11."
        ),
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        default="asyncio",
        description=(
            "The event loop of `serve --transport http`: `asyncio` (the standard library's), `uvloop` (libuv; "
            "less CPU per call), or `auto`: uvloop where it is installed (a dependency except on Windows). Both "
            "drain alike on SIGTERM. stdio serving always runs on asyncio."
        ),
    )
    drain_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description=(
            "On SIGTERM or SIGINT: the most seconds the requests in flight (tool calls) may take to finish "
            "while new ones are refused, before the gateway stops (`gateway.serving.drain`)."
        ),
    )
    drain_notice_seconds: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description=(
            "On SIGTERM: seconds `/readyz` answers 503 while the gateway still serves new requests, for a load "
            "balancer that polls readiness to stop sending; then new requests are refused and the drain begins."
        ),
    )
    metrics: bool = Field(default=True, description="Serve Prometheus metrics at GET /metrics.")
    metrics_public: bool = Field(
        default=False,
        description=(
            "Serve /metrics like the health probes: no credentials and no Host check (for a scraper on a "
            "private network). False: /metrics needs the same credentials as /mcp, from a caller with no profile."
        ),
    )


class PluginSettings(BaseModel):
    """Which plugins may load. Names are plugin names as `mcp-gateway plugins` prints them."""

    allow: list[str] = Field(default_factory=list, description="If non-empty, only these plugins load.")
    deny: list[str] = Field(default_factory=list, description="These plugins never load.")
    directory: Path | None = Field(
        default=None,
        description=(
            "Where `plugins/<name>/` directories are searched; relative to the config file's folder "
            "(default: its `plugins` folder), never to the current directory."
        ),
    )
    entry_points: bool = Field(
        default=True,
        description="False: load no installed plugins (entry points, the built-ins included), only directories.",
    )


class ResilienceSettings(BaseModel):
    """How proxied calls survive failing upstreams: retries, circuit breakers, health checks."""

    retry_attempts: int = Field(
        default=3, ge=1, le=10, description="Most attempts per tool call, the first included (1: never retry)."
    )
    retry_max_seconds: float = Field(
        default=10.0, ge=0, description="Retries stop once this many seconds have passed since the first attempt."
    )
    breaker_failures: int = Field(
        default=5, ge=1, description="Consecutive failed calls to one server that open its circuit breaker."
    )
    breaker_reset_seconds: float = Field(
        default=30.0, gt=0, description="Seconds an open breaker waits before letting one probe call through."
    )
    health_interval: float = Field(
        default=30.0, ge=0, description="Seconds between pings of each connected server (0: no health checks)."
    )
    max_concurrent_calls: int = Field(
        default=32, ge=1, description="Most requests in flight to one server; more wait their turn."
    )


DEFAULT_REDACT_KEYS = [
    "*password*",
    "*passwd*",
    "*secret*",
    "token",
    "*_token",
    "*-token",
    "*_key",
    "*-key",
    "apikey",
    "authorization",
    "cookie",
    "*credential*",
]
"""Argument keys whose values are never recorded: case-insensitive fnmatch globs."""


class RecordsSettings(BaseModel):
    """Execution records (`gateway.records`): what is kept, how it is buffered, for how long."""

    enabled: bool = Field(default=True, description="False: record nothing; no feedback tool or /feedback.")
    buffer_size: int = Field(
        default=10_000, ge=1, description="Most records held in memory before they are written; past it, dropped."
    )
    buffer_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=64 * 1024,
        description="Most bytes of records held in memory before they are written; past it, dropped.",
    )
    max_argument_bytes: int = Field(
        default=16 * 1024,
        ge=256,
        description="Most bytes stored of a call's arguments (as JSON); larger ones are cut, their size noted.",
    )
    max_result_bytes: int = Field(
        default=16 * 1024,
        ge=256,
        description="Most bytes stored of a result's text (the response summary) or an error's; more is cut.",
    )
    batch_size: int = Field(default=500, ge=1, description="A flush starts once this many records wait.")
    flush_interval: float = Field(default=1.0, gt=0, le=3600, description="Seconds between flushes at most.")
    retention_days: float = Field(default=30.0, gt=0, description="Records older than this are deleted.")
    redact_keys: list[str] = Field(
        default_factory=lambda: list(DEFAULT_REDACT_KEYS),
        description="Argument keys (case-insensitive globs, at any depth) whose values are stored as ***.",
    )
    store_queries: bool = Field(
        default=True, description="Keep the text of searches (the router learns from it); false: only their results."
    )


class TracingSettings(BaseModel):
    """OpenTelemetry tracing (`gateway.observability.tracing`). Where and how spans are sent is read
    from the standard `OTEL_*` variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_TRACES_SAMPLER`...)."""

    enabled: bool = Field(
        default=False,
        description="Export traces over OTLP (needs `pip install 'mcp-gateway[otel]'`); off: no exporter is loaded.",
    )
    layer_spans: bool = Field(
        default=True,
        description=(
            "Make a span for each call-chain layer that runs on every call (validation, each attempt); "
            "false: only the SDK's server and client spans, and spans for a breaker's refusal or a timeout."
        ),
    )
    capture_arguments: bool = Field(
        default=False,
        description=(
            "Put a tool call's arguments on its span (`gen_ai.tool.call.arguments`), redacted as the "
            "records redact them (`GATEWAY_RECORDS__REDACT_KEYS`, servers' configured secrets)."
        ),
    )


class ReloadSettings(BaseModel):
    """Live reload of the YAML file while `serve` runs (docs/settings.md, "Live reload")."""

    watch: bool = Field(
        default=True,
        description="Reload when the config file changes (its folder is watched, so a save by rename counts).",
    )
    debounce_seconds: float = Field(
        default=0.5,
        ge=0.05,
        le=60,
        description="A burst of changes to the file within this many seconds is one reload.",
    )
    drain_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Seconds the calls in flight on a removed or changed server may take before they are cancelled.",
    )


class OAuthSettings(BaseModel):
    """Upstreams behind OAuth (`auth: oauth` in the YAML; `gateway.upstreams.oauth`, docs/oauth.md)."""

    key: SecretStr | None = Field(
        default=None,
        description=(
            "The Fernet key (urlsafe base64 of 32 bytes) that encrypts stored OAuth tokens; unset: `key_file`. "
            'Make one with `python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"`.'
        ),
    )
    key_file: Path | None = Field(default=None, description="A file holding the Fernet key, when `key` is unset.")
    public_url: str | None = Field(
        default=None,
        description=(
            "The gateway's address as a browser reaches it (`https://gateway.example.com`), for the "
            "`/connect/callback` of per-user links; unset: the address the linking request came to."
        ),
    )
    poll_interval: float = Field(
        default=2.0,
        gt=0,
        description="Seconds between looks in the token store while a server waits for `mcp-gateway login`.",
    )


class UpstreamSettings(BaseModel):
    """How the gateway reaches its upstream servers (`gateway.upstreams`)."""

    http_client: Literal["lean", "httpx"] = Field(
        default="lean",
        description=(
            "The HTTP/1.1 layer under the client to streamable-HTTP servers: `lean`, the gateway's own "
            "(`gateway.upstreams.lean_http`; less CPU per call), or `httpx`, httpx2's (httpcore2). "
            "A server whose URL goes through a proxy from the environment gets `httpx` either way."
        ),
    )
    lean_calls: bool = Field(
        default=True,
        description=(
            "Forward `tools/call` to stdio and streamable-HTTP servers on the gateway's own path "
            "(`gateway.upstreams.lean_calls`: less CPU per call); false leaves every request to the SDK's client."
        ),
    )
    max_message_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description=(
            "Bytes of one message read from a stdio or HTTP server: a larger answer is dropped while it is "
            "read (never held whole) and its call gets a `result_too_large` error. Results are cut to "
            "`security.limits.max_result_bytes` after that."
        ),
    )
