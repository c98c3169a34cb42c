"""The YAML file's `auth:` and `security:` sections, as pydantic models.

`auth:` says who may use the HTTP endpoint (API keys stored as hashes, or JWTs from an
identity provider) and what each caller may see (profiles, the "virtual servers") and
how fast (token-bucket rate limits). `security:` says how tool definitions are vetted
(change detection, injection scanning) and the size limits of requests and results.
`gateway.config.loader` validates both sections and reports errors as file:line:key.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "HASH_PREFIX",
    "ApiKeyConfig",
    "AuthConfig",
    "JwtConfig",
    "LimitsConfig",
    "ProfileConfig",
    "RateLimit",
    "SecurityConfig",
]

HASH_PREFIX = "sha256:"
Algorithm = Literal["RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "EdDSA"]
DEFAULT_ALGORITHMS: tuple[Algorithm, ...] = ("RS256", "ES256")
_HASH_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimit(_Strict):
    """A token bucket: `burst` requests at once, refilled at `per_minute` requests a minute."""

    per_minute: float = Field(gt=0, description="Sustained requests per minute.")
    burst: int = Field(ge=1, description="Requests allowed at once before the rate applies.")


class ProfileConfig(_Strict):
    """A virtual server: which servers and tools a caller may see and call (fnmatch globs)."""

    servers: list[str] = Field(default_factory=lambda: ["*"], description="Server id globs.")
    tools: list[str] = Field(default_factory=lambda: ["*"], description="Exposed tool name globs (`prefix__tool`).")
    deny_tools: list[str] = Field(default_factory=list, description="Exposed tool name globs always hidden.")
    rate_limit: RateLimit | None = Field(default=None, description="Overrides `auth.rate_limit` for this profile.")


class ApiKeyConfig(_Strict):
    """One API key, stored only as its hash (`mcp-gateway keys new` prints both)."""

    name: str = Field(min_length=1, description="Who holds the key; shown in logs, never the key.")
    hash: str = Field(description="sha256:<64 hex digits> of the key.")
    profile: str | None = Field(default=None, description="A name under `auth.profiles`; unset: every tool.")
    rate_limit: RateLimit | None = Field(default=None, description="Overrides the profile's and the default.")
    admin: bool = Field(default=False, description="May use the operator console and the admin API (`/admin`).")

    @field_validator("hash")
    @classmethod
    def _check_hash(cls, value: str) -> str:
        value = value.strip().lower()
        if not _HASH_RE.match(value):
            raise ValueError("must be sha256:<64 hex digits>; make one with `mcp-gateway keys hash`")
        return value


class JwtConfig(_Strict):
    """Bearer JWTs from an identity provider, checked against its JWKS, issuer and audience."""

    jwks_file: Path | None = Field(default=None, description="A local JWKS JSON file.")
    jwks_url: str | None = Field(default=None, description="The provider's JWKS URL (fetched and cached).")
    issuer: str = Field(min_length=1, description="Required `iss`.")
    audience: list[str] = Field(min_length=1, description="Accepted `aud` values (one must match).")
    algorithms: list[Algorithm] = Field(default_factory=lambda: list(DEFAULT_ALGORITHMS), min_length=1)
    profile_claim: str = Field(default="gateway_profile", description="The claim naming the caller's profile.")
    default_profile: str | None = Field(default=None, description="Profile for tokens without the claim.")
    admin_claim: str = Field(
        default="gateway_admin", description="A claim that is `true` for callers who may use the console (`/admin`)."
    )
    leeway: float = Field(default=30.0, ge=0, le=600, description="Seconds of clock skew tolerated.")

    @field_validator("audience", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _one_source(self) -> JwtConfig:
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise ValueError("give exactly one of `jwks_file` or `jwks_url`")
        if self.jwks_url is not None and not self.jwks_url.startswith(("https://", "http://")):
            raise ValueError("`jwks_url` must be an http(s) URL")
        return self


class AuthConfig(_Strict):
    """`auth:` — inbound authentication of the HTTP transport (stdio needs none)."""

    api_keys: list[ApiKeyConfig] = Field(default_factory=list)
    jwt: JwtConfig | None = None
    profiles: dict[str, ProfileConfig] = Field(default_factory=dict)
    rate_limit: RateLimit = Field(
        default_factory=lambda: RateLimit(per_minute=600, burst=60),
        description="Per caller (key or JWT subject), unless a profile or key sets its own.",
    )
    resource_url: str | None = Field(
        default=None,
        description="The public URL of the MCP endpoint, for OAuth protected-resource metadata; "
        "unset: derived from each request.",
    )

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys) or self.jwt is not None

    @model_validator(mode="after")
    def _consistent(self) -> AuthConfig:
        names = [k.name for k in self.api_keys]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"two API keys are named {name!r}")
        hashes = [k.hash for k in self.api_keys]
        if len(set(hashes)) != len(hashes):
            raise ValueError("two API keys have the same hash")
        wanted = [k.profile for k in self.api_keys]
        if self.jwt is not None:
            wanted.append(self.jwt.default_profile)
        for profile in wanted:
            if profile is not None and profile not in self.profiles:
                known = ", ".join(self.profiles) or "none defined"
                raise ValueError(f"profile {profile!r} is not under `auth.profiles` ({known})")
        return self


class LimitsConfig(_Strict):
    """Size and count limits, each with a safe default."""

    max_request_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, description="HTTP request body (413 above).")
    max_argument_bytes: int = Field(default=1024 * 1024, ge=64, description="A tool call's arguments, as JSON.")
    max_result_bytes: int = Field(default=1024 * 1024, ge=256, description="A tool result; larger is truncated.")
    max_calls_per_session: int | None = Field(
        default=10_000, ge=1, description="Tool calls one client connection may make; null: no limit."
    )


class SecurityConfig(_Strict):
    """`security:` — vetting of upstream tool definitions, and limits."""

    tool_changes: Literal["warn", "block"] = Field(
        default="warn", description="A tool whose definition changed since first seen: warn, or withhold it."
    )
    injection: Literal["warn", "strip", "quarantine"] = Field(
        default="warn", description="A description with injection patterns: warn, strip them, or withhold the tool."
    )
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
