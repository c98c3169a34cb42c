"""One upstream server as declared in the YAML file, validated: `ServerConfig` and its tool filter.

Kept apart from the loader (`gateway.config.loader`), which turns the file's many layouts into
these models and reports problems by file, line and key.
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Iterator
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

__all__ = [
    "MASK",
    "PREFIX_MAX",
    "PREFIX_RE",
    "SERVER_ID_RE",
    "OAuthConfig",
    "ServerConfig",
    "TokenExchangeConfig",
    "ToolFilter",
]

SERVER_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
PREFIX_RE = re.compile(r"^[A-Za-z0-9_-]*$")
PREFIX_MAX = 32
MASK = "***"


class ToolFilter(BaseModel):
    """Which of an upstream's tools the gateway exposes, by fnmatch globs on its own tool names."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow: list[str] = Field(default_factory=list, description="If non-empty, only matching tools.")
    deny: list[str] = Field(default_factory=list, description="Matching tools are always hidden.")

    def permits(self, tool_name: str) -> bool:
        """Allowed if (no allow or matches an allow) and matches no deny; case-sensitive on every OS."""
        if self.allow and not any(fnmatch.fnmatchcase(tool_name, p) for p in self.allow):
            return False
        return not any(fnmatch.fnmatchcase(tool_name, p) for p in self.deny)


class TokenExchangeConfig(BaseModel):
    """`auth.token_exchange`: RFC 8693: a caller's own JWT exchanged at an identity provider for a token
    of this server, with no browser step (per-user servers; callers holding API keys link instead)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_endpoint: str
    """The identity provider's token endpoint that performs the exchange."""
    audience: str | None = None
    """The `audience` asked for (RFC 8693 §2.1), besides the server's URL as `resource`."""
    subject_token_type: Literal["jwt", "access_token"] = "jwt"
    """How the caller's token is described to the provider."""

    @field_validator("token_endpoint")
    @classmethod
    def _check_endpoint(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("must be an http:// or https:// URL")
        return value


class OAuthConfig(BaseModel):
    """`auth: oauth` (or `auth: {type: oauth, ...}`) on an http/sse server: the gateway gets its
    tokens by the MCP authorization spec (`gateway.upstreams.oauth`, docs/oauth.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["oauth"] = "oauth"
    per_user: bool = False
    """Each caller links their own account (`/connect/SERVER`); calls never use another's token."""
    client_id: str | None = None
    """A pre-registered client; unset: dynamic client registration (RFC 7591)."""
    client_secret: str | None = Field(default=None, repr=False)
    """The pre-registered client's secret (`${VAR}`, or `client_secret_file` in the YAML)."""
    scopes: list[str] = Field(default_factory=list)
    """Scopes to ask for; empty: the ones the server's challenge or metadata asks for."""
    callback_port: int = Field(default=0, ge=0, le=65535)
    """The 127.0.0.1 port `mcp-gateway login` catches the callback on; 0: a free one (dynamic
    registration only: a pre-registered client's redirect URI needs a fixed port)."""
    client_name: str = "mcp-gateway"
    token_exchange: TokenExchangeConfig | None = None
    """RFC 8693 exchange of a caller's JWT (with `per_user`): the client given by `client_id` asks for it."""

    @model_validator(mode="before")
    @classmethod
    def _from_word(cls, data: Any) -> Any:
        if data == "oauth":
            return {"type": "oauth"}
        if isinstance(data, str):
            raise ValueError("must be `oauth` or a mapping with `type: oauth`")
        return data

    @model_validator(mode="after")
    def _check_client(self) -> OAuthConfig:
        if self.client_secret is not None and self.client_id is None:
            raise ValueError("`client_secret` needs `client_id` (the pre-registered client it belongs to)")
        if self.token_exchange is not None and not (self.per_user and self.client_id):
            raise ValueError("`token_exchange` needs `per_user: true` and the `client_id` that asks for the exchange")
        return self


class ServerConfig(BaseModel):
    """One upstream MCP server. Its repr never shows env/header values or interpolated text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    name: str
    description: str = ""
    transport: Literal["stdio", "http", "sse"]
    # `auto`: try the 2026-07-28 `server/discover` probe, then fall back to the `initialize`
    # handshake; `legacy`: go straight to `initialize` (for servers that mishandle the probe).
    protocol: Literal["auto", "legacy"] = "auto"
    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, str] = Field(default_factory=dict, repr=False)
    secret_headers: dict[str, str] = Field(default_factory=dict, repr=False)
    capabilities: list[str] = Field(default_factory=list)
    enabled: bool = True
    timeout: float | None = None
    tool_timeouts: dict[str, float] = Field(default_factory=dict)
    retry_tools: list[str] = Field(default_factory=list)
    max_concurrent_calls: int | None = Field(default=None, ge=1)
    health_interval: float | None = Field(default=None, ge=0)
    start: Literal["eager", "on_demand"] = "eager"
    idle_timeout: float = Field(default=300.0, gt=0)
    forward_caller_token: bool = False
    auth: OAuthConfig | None = None
    stderr_log_level: Literal["debug", "info", "warning"] = "debug"
    tools: ToolFilter = Field(default_factory=ToolFilter)
    prefix: str
    # Field name -> display value with `${...}` substitutions masked; set by the loader.
    _masked: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_name_and_prefix(cls, data: Any) -> Any:
        if isinstance(data, dict) and "id" in data:
            data = {"name": data["id"], "prefix": data["id"], **data}
        return data

    @field_validator("id")
    @classmethod
    def _check_id(cls, value: str) -> str:
        if not SERVER_ID_RE.match(value):
            raise ValueError("must start with a letter or digit and contain only letters, digits, '_', '.', '-'")
        return value

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, value: str) -> str:
        if not PREFIX_RE.match(value) or len(value) > PREFIX_MAX:
            raise ValueError(f"must be at most {PREFIX_MAX} letters, digits, '_' or '-' (or empty)")
        return value

    @field_validator("timeout", mode="before")
    @classmethod
    def _check_timeout(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("must be a positive number of seconds")
        return value

    @field_validator("timeout")
    @classmethod
    def _check_timeout_range(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError("must be a positive number of seconds")
        return value

    @field_validator("tool_timeouts")
    @classmethod
    def _check_tool_timeouts(cls, value: dict[str, float]) -> dict[str, float]:
        for seconds in value.values():
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError("each timeout must be a positive number of seconds")
        return value

    @field_validator("command")
    @classmethod
    def _check_command(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None:
            parts = urlsplit(value)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("must be an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _check_transport(self) -> ServerConfig:
        if self.transport == "stdio" and (self.command is None or self.url is not None):
            raise ValueError("a stdio server needs `command` and no `url`")
        if self.transport != "stdio" and (self.url is None or self.command is not None):
            raise ValueError(f"an {self.transport} server needs `url` and no `command`")
        if self.start == "on_demand" and self.transport != "stdio":
            raise ValueError("`start: on_demand` applies to stdio servers (with `command`)")
        if "idle_timeout" in self.model_fields_set and self.start != "on_demand":
            raise ValueError("`idle_timeout` applies to servers with `start: on_demand`")
        if self.forward_caller_token and self.transport == "stdio":
            raise ValueError("`forward_caller_token` applies to http/sse servers (with `url`)")
        if self.auth is not None and self.transport == "stdio":
            raise ValueError("`auth: oauth` applies to http/sse servers (with `url`)")
        if self.auth is not None and self.forward_caller_token:
            raise ValueError("give either `auth: oauth` or `forward_caller_token`, not both")
        return self

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():
            if name == "auth" and value is not None and value.client_secret is not None:
                value = value.model_copy(update={"client_secret": MASK})
            if name in ("env", "headers"):
                value = {key: MASK for key in value}  # values are often tokens, even when literal
            elif name in self._masked:
                value = self._masked[name]
            yield name, value
