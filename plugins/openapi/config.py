"""The `plugins: {openapi: ...}` section of the YAML file.

Secrets are never values here: every credential setting names an environment
variable of the gateway's process, read when a request is sent.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["EXAMPLES", "AuthConfig", "Config", "SpecConfig", "example_names", "missing_variables", "resolve_source"]

_URL = re.compile(r"^https?://", re.IGNORECASE)
_EXAMPLE = "example:"
EXAMPLES = Path(__file__).resolve().parent / "examples"
"""The specs shipped with the plugin (installed with it), named in a config as `example:<file name without .json>`."""
SECRET_HEADER = re.compile(r"auth|token|key|secret|cookie|session|password", re.IGNORECASE)
"""Header names whose configured values are treated as secrets (kept out of every output)."""


class AuthConfig(BaseModel):
    """Credentials, each taken from an environment variable when a request is sent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    bearer_token_env: str | None = Field(
        default=None, description="Environment variable holding a token sent as `Authorization: Bearer <token>`."
    )
    api_key_env: str | None = Field(default=None, description="Environment variable holding an API key.")
    api_key_header: str | None = Field(default=None, description="Header that carries the API key, e.g. X-Api-Key.")
    api_key_query: str | None = Field(default=None, description="Query parameter that carries the API key.")
    basic_username_env: str | None = Field(default=None, description="Environment variable: HTTP Basic user name.")
    basic_password_env: str | None = Field(default=None, description="Environment variable: HTTP Basic password.")

    @model_validator(mode="after")
    def _consistent(self) -> AuthConfig:
        if self.api_key_env and bool(self.api_key_header) == bool(self.api_key_query):
            raise ValueError("api_key_env needs exactly one of api_key_header or api_key_query")
        if (self.api_key_header or self.api_key_query) and not self.api_key_env:
            raise ValueError("api_key_header/api_key_query need api_key_env (the variable holding the key)")
        if bool(self.basic_username_env) != bool(self.basic_password_env):
            raise ValueError("basic_username_env and basic_password_env go together")
        if self.bearer_token_env and self.basic_username_env:
            raise ValueError("choose bearer_token_env or basic_*_env: both set the Authorization header")
        return self

    def variables(self) -> list[str]:
        """The environment variables these credentials read."""
        names = (self.bearer_token_env, self.api_key_env, self.basic_username_env, self.basic_password_env)
        return [n for n in names if n]


class SpecConfig(BaseModel):
    """One API: where its OpenAPI document is, where to send requests, and how to authenticate."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$",
        description="Short name of the API; qualifies operation ids when several specs are configured.",
    )
    source: str = Field(
        min_length=1,
        description="The OpenAPI 3.x document (JSON or YAML): an http(s) URL, `example:<name>` for a spec "
        "shipped with the plugin, or a file path; a relative path is relative to the directory of the YAML file.",
    )
    base_url: str | None = Field(default=None, description="Where requests go; default: the spec's first server.")
    auth: AuthConfig = Field(default_factory=AuthConfig)
    headers: dict[str, str] = Field(default_factory=dict, description="Extra headers sent with every request.")
    timeout: float = Field(default=30.0, gt=0, le=600, description="Seconds allowed for one request.")
    max_response_bytes: int = Field(
        default=100_000, ge=1_000, le=10_000_000, description="Longer response bodies are cut, with a note."
    )

    @model_validator(mode="after")
    def _base_url_is_http(self) -> SpecConfig:
        if self.base_url is not None and not _URL.match(self.base_url):
            raise ValueError(f"base_url must be an http(s) URL, not {self.base_url!r}")
        return self

    @model_validator(mode="after")
    def _example_exists(self) -> SpecConfig:
        name = self.source.removeprefix(_EXAMPLE)
        if self.source.startswith(_EXAMPLE) and name not in example_names():
            raise ValueError(f"no example spec named {name!r}; the examples are: {', '.join(example_names())}")
        return self

    def secret_header_values(self) -> list[str]:
        return [v for k, v in self.headers.items() if SECRET_HEADER.search(k)]


class Config(BaseModel):
    """`plugins: {openapi: {specs: [...]}}`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    specs: list[SpecConfig] = Field(default_factory=list, description="The APIs to explore; none: the tools say so.")
    search_wait: float = Field(
        default=20.0,
        ge=0,
        le=600,
        description="Seconds a search waits for the embedding index on first use before answering with BM25 alone.",
    )

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        names = [s.name for s in self.specs]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"spec names must be unique; used twice: {', '.join(twice)}")
        return self


def example_names() -> list[str]:
    """The names `example:<name>` accepts."""
    return sorted(path.stem for path in EXAMPLES.glob("*.json"))


def resolve_source(source: str, config_file: Path) -> str:
    """A URL as is; `example:<name>` as the shipped file; a path with `~` and `$VARS` expanded, made absolute
    against the YAML file's directory (a desktop client may start the gateway anywhere)."""
    if _URL.match(source):
        return source
    if source.startswith(_EXAMPLE):
        return str(EXAMPLES / f"{source.removeprefix(_EXAMPLE)}.json")
    path = Path(os.path.expandvars(source)).expanduser()
    if not path.is_absolute():
        path = config_file.resolve().parent / path
    return str(path)


def missing_variables(spec: SpecConfig, environ: Mapping[str, str]) -> list[str]:
    return [name for name in spec.auth.variables() if not environ.get(name)]
