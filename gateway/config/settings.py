"""Gateway-wide settings, from the environment (`GATEWAY_*`, nested with `__`) and `.env`.

The YAML file (`gateway.config.loader`) says *which* servers sit behind the gateway; these
settings say *how* the gateway itself runs. Keeping them apart lets an operator
change ports, paths or limits per deployment without touching the shared YAML.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = [
    "CodeModeSettings",
    "EmbeddingSettings",
    "HttpSettings",
    "LearningSettings",
    "OAuthSettings",
    "PluginSettings",
    "RecordsSettings",
    "ReloadSettings",
    "ResilienceSettings",
    "RoutingSettings",
    "SecondStageSettings",
    "Settings",
    "TracingSettings",
    "default_data_dir",
    "default_replica_id",
    "deployment_data_dir",
    "legacy_data_dir_notice",
]


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/mcp-gateway`, or `~/.local/share/mcp-gateway`: the parent of every deployment's
    own data dir (and, before deployments had their own, the data dir every gateway shared)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-gateway"


def default_replica_id() -> str:
    """`<host name>-<process id>`: unique among the processes of a deployment (a pod's host name is its name)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def deployment_data_dir(config: Path) -> Path:
    """The data dir of the gateway serving `config`, when none is named: `<default>/deployments/<name>-<hash>`.

    Its identity is the config file's resolved path, so two gateways serving different configs on one
    machine never share records, approvals, fingerprints, plugin data or the runtime file, and every
    command given the same config (`reload`, `calls`, `servers`) finds the same one. The name part
    (the config's folder and stem) is only for people listing the folder."""
    resolved = Path(config).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{resolved.parent.name}-{resolved.stem}").strip("._-")[:48]
    return default_data_dir() / "deployments" / f"{label or 'config'}-{digest}"


LEGACY_STATE = ("records.sqlite3", "tool-integrity.sqlite3", "notes", "sql", "oauth")
"""What a gateway of an earlier version left in the shared default data dir (records, approvals and
fingerprints, plugin data, OAuth tokens): its presence there is worth telling the operator about."""


def legacy_data_dir_notice(settings: Settings) -> str | None:
    """A notice for an operator upgrading from the shared data dir: where the old data is, and how to
    keep it. None when the data dir is named, or the old one holds no state, or this deployment's
    dir already exists (the notice is given once, when the deployment's dir is first made)."""
    if settings.data_dir_named or settings.data_dir.exists():
        return None
    old = default_data_dir()
    found = [name for name in LEGACY_STATE if (old / name).exists()]
    if not found:
        return None
    return (
        f"this gateway keeps its state in {settings.data_dir}, its own for the config {settings.config}. "
        f"Earlier versions shared {old} among all gateways; it still holds {', '.join(found)}. To go on "
        f"using that data with this config, set GATEWAY_DATA_DIR={old}, or move those files into "
        f'{settings.data_dir} (docs/deployment.md, "Where a gateway keeps its state").'
    )


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


class EmbeddingSettings(BaseModel):
    """The embedding model of the semantic router."""

    enabled: bool = Field(default=True, description="False: route with BM25 alone, load no model.")
    model: str | None = Field(
        default=None,
        description=(
            "A fastembed model name (downloaded by fastembed from its model hub on first use); "
            "unset: the bundled all-MiniLM-L6-v2 int8 model, installed with the gateway."
        ),
    )
    model_path: Path | None = Field(
        default=None, description="A local directory with a fastembed-compatible ONNX model and its tokenizer."
    )
    threads: int | None = Field(default=None, ge=1, description="ONNX Runtime threads; unset: all cores.")
    document_workers: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "Document batches embedded at once in bulk, each single-threaded on a second model "
            "session (about 60 MB, released 30 s after the last bulk call); 1: one at a time on the "
            "query session, no second session; "
            "unset: `threads`, else one per core."
        ),
    )
    batch_size: int = Field(
        default=8,
        ge=1,
        le=4096,
        description="Documents embedded per batch (8: the fastest for tools' short texts on a 2-core CPU).",
    )
    max_query_tokens: int = Field(
        default=64,
        ge=8,
        le=512,
        description=(
            "Word pieces of a search request the model reads (the rest is cut; BM25 reads it all); "
            "applies to the bundled model and models of its layout."
        ),
    )
    int8_matmul: bool = Field(
        default=False,
        description=(
            "True: the bundled model's matrix weights stay int8 and run on int8 kernels (about 30 MB less "
            "a session; vectors within cosine 0.999 of the float32 run's, cached under their own id)."
        ),
    )
    # --- issue 30: your own model, on this machine (model_sha256) or behind an endpoint (url ...)
    model_sha256: dict[str, str] = Field(
        default_factory=dict,
        description=(
            'With `model_path`: the sha256 of the directory\'s files, as JSON (`{"model.onnx": "9f2c..."}`); '
            "every file named is checked when the model loads, and a mismatch routes with BM25 alone."
        ),
    )
    url: str | None = Field(
        default=None,
        description=(
            "An OpenAI-compatible embeddings endpoint (`http://127.0.0.1:11434/v1`: Ollama, vLLM, "
            "text-embeddings-inference, Infinity, LiteLLM, OpenAI); `/embeddings` is appended unless the URL "
            "ends with it. Set: tools and requests are embedded there, by the model `model`."
        ),
    )
    api_key_env: str | None = Field(
        default=None,
        description="With `url`: the environment variable holding the endpoint's API key (sent as a bearer token).",
    )
    request_batch: int = Field(
        default=64, ge=1, le=2048, description="With `url`: most texts sent in one request to the endpoint."
    )
    timeout: float = Field(
        default=30.0, gt=0, le=600, description="With `url`: seconds a request of documents may take."
    )
    query_timeout: float = Field(
        default=2.0,
        gt=0,
        le=60,
        description=(
            "With `url`: seconds a search request's embedding may take; past it, or with the endpoint "
            "down, that search is ranked with BM25 alone (keep it under `GATEWAY_ROUTING__SEARCH_TIMEOUT`)."
        ),
    )
    retry_seconds: float = Field(
        default=30.0,
        gt=0,
        le=3600,
        description="With `url`: after a failure, seconds before the endpoint is tried again (BM25 meanwhile).",
    )


class RoutingSettings(BaseModel):
    """How tools are exposed and ranked."""

    mode: Literal["auto", "all", "search", "dynamic", "code"] = Field(
        default="auto",
        description=(
            "auto: all while a client may see at most auto_max_tools tools, dynamic beyond (clients degrade "
            "past 30-50 tools); all: every tool in tools/list; search: pinned tools plus search_tools and "
            "call_tool; dynamic: as search, and found tools are added to the session's tools/list; code: "
            "search_tools, describe_tools and execute, a Python program calling every tool (docs/code-mode.md)."
        ),
    )
    auto_max_tools: int = Field(
        default=40, ge=1, le=10_000, description="auto mode: the most tools a client is shown whole (all mode)."
    )
    k: int = Field(default=8, ge=1, le=50, description="Tools returned by a search unless the caller asks otherwise.")
    threshold: float = Field(default=0.0, ge=0.0, le=1.0, description="Results scoring below this are dropped.")
    no_fit_threshold: float = Field(
        default=0.17,
        ge=0.0,
        le=1.0,
        description=(
            "When the best result scores below this, search_tools and POST /route answer 'no tool fits this "
            "request' and list the closest tools as hints, not matches (0: always answer). 0.17: the most "
            "refusals losing at most 0.02 recall@5 on every dev set (mcp-gateway eval --abstain)."
        ),
    )
    pinned: list[str] = Field(default_factory=list, description="Exposed tool names always listed and returned.")
    search_timeout: float = Field(default=5.0, gt=0, description="Seconds a search_tools call may take.")
    max_query_chars: int = Field(
        default=4_000,
        ge=100,
        le=1_000_000,
        description=(
            "Characters of a search_tools or POST /route request that are ranked; the rest is cut before any "
            "work (the model reads 64 word pieces of it anyway), so a huge request costs what a long one does."
        ),
    )
    dynamic_max_tools: int = Field(
        default=32, ge=1, le=500, description="dynamic mode: most tools a session's list grows to (least recent out)."
    )


class CodeModeSettings(BaseModel):
    """Code mode (`routing.mode: code`): the sandbox a model's program runs in, and its limits
    (docs/code-mode.md). Each limit is named in the error a program gets when it hits it."""

    wall_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="Seconds a program may run in all, its tool calls included."
    )
    cpu_seconds: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="Seconds of interpreter time a program may use (time waiting for tool calls not counted).",
    )
    memory_mb: int = Field(default=256, ge=1, le=65_536, description="Heap a program may use, in MiB.")
    max_recursion_depth: int = Field(
        default=200, ge=10, le=10_000, description="Deepest call stack a program may build."
    )
    max_tool_calls: int = Field(default=200, ge=1, le=100_000, description="Tool calls one program run may make.")
    max_output_bytes: int = Field(
        default=20_000,
        ge=256,
        le=10_000_000,
        description=(
            "Bytes of return value and of printed output each given back to the model; the rest is cut, with a note."
        ),
    )
    allow_writes: list[str] = Field(
        default_factory=list,
        description=(
            "Exposed tool names (fnmatch globs: `notes__*` for a whole server, `notes__add` for one tool) a program "
            "may call although they are not annotated readOnlyHint: true. Empty: programs only read."
        ),
    )
    confirm_writes: bool = Field(
        default=True,
        description=(
            "Ask a client that supports elicitation, once per run, whether the program may call the write tools "
            "allow_writes does not name; yes lets that run call them all. Off: only allow_writes counts."
        ),
    )
    confirm_seconds: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        description="Seconds the client has to answer that question; no answer in time is a no.",
    )
    workers: int = Field(default=2, ge=1, le=64, description="Most sandbox worker processes running programs at once.")
    warm_workers: int = Field(default=1, ge=0, le=64, description="Worker processes kept started while idle.")


class SecondStageSettings(BaseModel):
    """A second look at the router's top candidates (issue 30): a reranker endpoint or an LLM judge.

    Bounded in time and candidates; on any failure (down, slow, nonsense) the first stage's
    ranking stands. See docs/router.md, "Choosing a model"."""

    kind: Literal["off", "rerank", "judge"] = Field(
        default="off",
        description=(
            "off: the router's ranking as is; rerank: a `/rerank` endpoint (text-embeddings-inference, "
            "Infinity, Cohere, Jina, Voyage) reorders the top candidates; judge: an LLM says which candidates "
            "fit the request, or that none does (the client's own model through MCP sampling when the client "
            "offers it and `sampling` is on, else the chat endpoint at `url`)."
        ),
    )
    url: str | None = Field(
        default=None,
        description=(
            "rerank: the endpoint (`/rerank` is appended unless the URL ends with it); judge: an "
            "OpenAI-compatible chat endpoint (`/chat/completions` appended likewise), used when the client "
            "offers no sampling; unset: the judge asks the client only."
        ),
    )
    model: str | None = Field(default=None, description="The model the endpoint runs (sent as `model`).")
    api_key_env: str | None = Field(
        default=None, description="The environment variable holding the endpoint's API key (a bearer token)."
    )
    sampling: bool = Field(
        default=True,
        description="judge: ask the client's own model through MCP sampling when the client declares sampling.",
    )
    candidates: int = Field(
        default=10, ge=2, le=50, description="The first stage's best tools the second stage looks at."
    )
    timeout: float = Field(
        default=10.0,
        gt=0,
        le=120,
        description="Seconds the second stage may take; past it the first stage's ranking stands.",
    )
    max_tokens: int = Field(default=200, ge=16, le=4096, description="judge: most tokens of the model's answer.")

    @model_validator(mode="after")
    def _check_rerank_url(self) -> SecondStageSettings:
        if self.kind == "rerank" and not self.url:
            raise ValueError("kind rerank needs url: the reranker's /rerank endpoint (GATEWAY_SECOND_STAGE__URL)")
        return self


class LearningSettings(BaseModel):
    """How the router learns from use (executions and feedback); see docs/architecture.md."""

    enabled: bool = Field(default=True, description="False: rank by content alone, read no usage signals.")
    max_boost: float = Field(default=0.25, ge=0, le=1, description="Most a tool's 0..1 score is raised by use.")
    max_penalty: float = Field(
        default=0.15, ge=0, le=1, description="Most a tool's 0..1 score is lowered by failures and thumbs-down."
    )
    max_prior: float = Field(
        default=0.03, ge=0, le=1, description="Most signals not tied to a search (calls by name) move a tool."
    )
    half_life_days: float = Field(default=30.0, gt=0, description="A signal's weight halves every this many days.")
    min_similarity: float = Field(
        default=0.3, ge=0, lt=1, description="Signals from requests less similar than this (cosine) are ignored."
    )
    half_weight_signals: float = Field(
        default=2.0, gt=0, description="Agreeing signals from the same request that move a tool half the bound."
    )
    max_signals: int = Field(default=100_000, ge=1, description="Most signals kept in memory (the newest).")
    refresh_seconds: float = Field(default=30.0, gt=0, description="Seconds between reads of new signals.")


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
    """Live reload of the YAML file while `serve` runs (docs/configuration.md, "Live reload")."""

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
    max_message_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=64 * 1024,
        description=(
            "Bytes of one message read from a stdio or HTTP server: a larger answer is dropped while it is "
            "read (never held whole) and its call gets a `result_too_large` error. Results are cut to "
            "`security.limits.max_result_bytes` after that."
        ),
    )


class Settings(BaseSettings):
    """Everything that is not in the YAML file."""

    model_config = SettingsConfigDict(
        env_prefix="GATEWAY_",
        env_nested_delimiter="__",
        env_file=".env",
        extra="ignore",
    )

    config: Path = Field(default=Path("external-mcps.yaml"), description="Path of the YAML server list.")
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description=(
            "Where the gateway keeps its state (records, approvals and fingerprints, the runtime file, plugin "
            "data, OAuth tokens, models); unset: a folder of its own per config file under "
            "`~/.local/share/mcp-gateway/deployments/` (`deployment_data_dir`)."
        ),
    )
    database_url: str | None = Field(
        default=None,
        description=(
            "Where records (and, for PostgreSQL, the embedding cache) live: a `postgresql://` URL, "
            "or unset for SQLite files in the data dir."
        ),
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        min_length=1,
        max_length=200,
        description=(
            "This process's name among the replicas of a deployment: in records, audit rows, metrics, traces "
            "(`service.instance.id`), JSON logs and the console. Default `<host name>-<process id>`."
        ),
    )
    state_resync_seconds: float = Field(
        default=5.0,
        gt=0,
        le=3600,
        description=(
            "With a database: how often a replica re-reads the shared state's revisions, in case it missed a "
            "change notification (changes arrive by LISTEN/NOTIFY within milliseconds otherwise)."
        ),
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="`json`: one JSON object per log line, with the trace and span ids, server and tool where known.",
    )
    startup_timeout: float = Field(
        default=30.0, gt=0, description="Seconds a server may take to connect before it is marked failed."
    )
    call_timeout: float = Field(
        default=60.0, gt=0, description="Default seconds per proxied request, unless a server sets `timeout`."
    )
    loop_stall_threshold: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description=(
            "Seconds the event loop may be held (by a plugin tool that blocks) before the watchdog logs who "
            "holds it and counts it in the metrics; 0: no watchdog."
        ),
    )
    list_wait: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a list request made at start-up waits for servers that are still connecting.",
    )
    page_size: int = Field(
        default=500, ge=1, le=10_000, description="Items per page in the gateway's own list responses."
    )
    max_nesting: int = Field(
        default=3,
        ge=1,
        le=32,
        description=(
            "Most gateways in a chain of gateways that start one another, this one included "
            "(1: a gateway started by a gateway refuses to start)."
        ),
    )
    http: HttpSettings = Field(default_factory=HttpSettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    codemode: CodeModeSettings = Field(default_factory=CodeModeSettings)
    learning: LearningSettings = Field(default_factory=LearningSettings)
    second_stage: SecondStageSettings = Field(default_factory=SecondStageSettings)
    plugins: PluginSettings = Field(default_factory=PluginSettings)
    resilience: ResilienceSettings = Field(default_factory=ResilienceSettings)
    records: RecordsSettings = Field(default_factory=RecordsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    reload: ReloadSettings = Field(default_factory=ReloadSettings)
    oauth: OAuthSettings = Field(default_factory=OAuthSettings)
    upstreams: UpstreamSettings = Field(default_factory=UpstreamSettings)

    @model_validator(mode="after")
    def _scope_data_dir(self) -> Settings:
        """Unless a data dir is named, the one of this config's deployment (`deployment_data_dir`)."""
        if "data_dir" not in self.model_fields_set:
            self.__dict__["data_dir"] = deployment_data_dir(self.config)  # not marked as set: it follows the config
        return self

    def with_config(self, config: Path) -> Settings:
        """These settings for another config file; an unnamed data dir follows it."""
        changed = self.model_copy(update={"config": config})
        if "data_dir" not in changed.model_fields_set:
            changed.__dict__["data_dir"] = deployment_data_dir(config)
        return changed

    @property
    def data_dir_named(self) -> bool:
        """Whether the data dir was named (`GATEWAY_DATA_DIR`, `.env`, or in code) rather than derived."""
        return "data_dir" in self.model_fields_set

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("postgresql://", "postgres://")):
            scheme = value.split(":", 1)[0]
            raise ValueError(
                f"must be a postgresql:// URL, or unset for SQLite files in the data dir; got {scheme}:..."
            )
        return value or None


def describe_settings_error(error: ValidationError) -> str:
    """A settings error as the environment variables people set, never with their values (secrets)."""
    parts = []
    for item in error.errors():
        name = "GATEWAY_" + "__".join(str(part) for part in item["loc"]).upper()
        parts.append(f"{name}: {item['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
