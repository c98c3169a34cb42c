"""Gateway-wide settings, from the environment (`GATEWAY_*`, nested with `__`) and `.env`.

The YAML file (`gateway.config.loader`) says *which* servers sit behind the gateway; these
settings say *how* the gateway itself runs. Keeping them apart lets an operator
change ports, paths or limits per deployment without touching the shared YAML.

`Settings` and where a deployment keeps its state live here; the sections it is made of live in
`gateway.config.runtime_settings` (transport, upstreams, records...) and
`gateway.config.routing_settings` (embedding, routing, code mode...).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gateway.config.routing_settings import (
    CodeModeSettings,
    EmbeddingSettings,
    LearningSettings,
    RoutingSettings,
    SecondStageSettings,
)
from gateway.config.runtime_settings import (
    HttpSettings,
    OAuthSettings,
    PluginSettings,
    RecordsSettings,
    ReloadSettings,
    ResilienceSettings,
    TracingSettings,
    UpstreamSettings,
)

__all__ = [
    "Settings",
    "default_data_dir",
    "default_replica_id",
    "deployment_data_dir",
    "describe_settings_error",
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
    lean_path: bool = Field(
        default=True,
        description=(
            "Serve the hot requests of a handshake-era session (`tools/call`, `tools/list`, `resources/read`, "
            "`prompts/get`) on the gateway's own path beside the SDK's, over stdio (`gateway.serving.stdio_lean`) "
            "and streamable HTTP (`http.lean_path`), and forward calls upstream on it (`upstreams.lean_calls`): "
            "the same answers for less CPU per call. `false`: every request goes through the SDK, served and "
            "forwarded (`http.lean_path` and `upstreams.lean_calls` are off with it)."
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

    @model_validator(mode="after")
    def _lean_path_everywhere(self) -> Settings:
        """`lean_path: false` turns every lean path off: HTTP serving's (`http.lean_path`) and the calls
        forwarded upstream (`upstreams.lean_calls`) too, each of which can also be turned off alone."""
        if not self.lean_path:
            if self.http.lean_path:
                self.__dict__["http"] = self.http.model_copy(update={"lean_path": False})
            if self.upstreams.lean_calls:
                self.__dict__["upstreams"] = self.upstreams.model_copy(update={"lean_calls": False})
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
