"""What the YAML file parses to (`GatewayConfig`), and how its problems are told (`ConfigError`).

Apart from the parser (`gateway.config.parser`) and the loader's entry points
(`gateway.config.loader`) so both can use them without importing each other: the parser builds
these, the loader hands them out, and plugin sections validated later report errors the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from gateway.config.security import AuthConfig, SecurityConfig
from gateway.config.servers import ServerConfig

__all__ = [
    "ConfigError",
    "GatewayConfig",
    "KeyPath",
    "MissingVariable",
    "UnusableServer",
    "format_key",
    "validate_section",
]

KeyPath = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


class ConfigError(Exception):
    """One clear message naming the file, line and key path."""

    def __init__(self, path: Path, message: str, line: int | None = None, key: str | None = None) -> None:
        super().__init__(path, message, line, key)  # all args, so the error pickles
        self.path = path
        self.message = message
        self.line = line
        self.key = key

    def __str__(self) -> str:
        where = str(self.path) + (f":{self.line}" if self.line is not None else "")
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


class MissingVariable(ConfigError):
    """A `${VAR}` (or a credential's `NAME_env`) names an environment variable that is not set.

    In a server's entry it makes that server unusable, not the file: the server is kept in
    `GatewayConfig.unusable` with this error as its reason, and the others are served."""


class UnusableServer(BaseModel):
    """A server entry that cannot be used as written (an environment variable it needs is not set):
    served as `failed` with `reason` (`file:line: key: ...`), never started."""

    model_config = ConfigDict(frozen=True)

    id: str
    prefix: str
    transport: Literal["stdio", "http", "sse"]
    enabled: bool
    reason: str


class GatewayConfig(BaseModel):
    """The whole file: upstream servers in file order (disabled ones too) and raw plugin settings."""

    model_config = ConfigDict(frozen=True)

    path: Path
    servers: dict[str, ServerConfig] = Field(default_factory=dict)
    unusable: dict[str, UnusableServer] = Field(default_factory=dict)
    """Servers whose entry needs an environment variable that is not set: reported failed, with why."""
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)
    plugin_directories: tuple[Path, ...] = ()
    """`plugins.directories`: folders of plugin directories, made absolute against the file's folder."""
    auth: AuthConfig = Field(default_factory=AuthConfig)
    security: SecurityConfig = Field(default_factory=SecurityConfig)
    _lines: dict[KeyPath, int] = PrivateAttr(default_factory=dict)
    """Key path -> line in the file, kept so plugin settings validated later name their line."""

    def enabled_servers(self) -> list[ServerConfig]:
        """The servers the gateway should start, in file order."""
        return [server for server in self.servers.values() if server.enabled]

    def line_of(self, key_path: KeyPath) -> int | None:
        """The line of the deepest part of `key_path` found in the file (missing keys: their parent's)."""
        for end in range(len(key_path), -1, -1):
            if key_path[:end] in self._lines:
                return self._lines[key_path[:end]]
        return None


def validate_section(
    model: type[M], raw: Any, base: KeyPath, path: Path, line_of: Callable[[KeyPath], int | None]
) -> M:
    """Validate one YAML section against `model`; the first problem is a ConfigError at its line."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        key_path: KeyPath = (*base, *(part for part in first["loc"] if isinstance(part, str | int)))
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            known = _fields_at(model, [part for part in first["loc"][:-1] if isinstance(part, str)])
            close = difflib.get_close_matches(str(key_path[-1]), known, n=1)
            message = f"unknown setting{f' (did you mean {close[0]!r}?)' if close else ''}"
        if len(exc.errors()) > 1:
            message += f" (and {len(exc.errors()) - 1} more)"
        raise ConfigError(path, message, line_of(key_path), format_key(key_path)) from None


def _fields_at(model: type[BaseModel], names: list[str]) -> list[str]:
    """The field names of the model nested at `names` (list items and dict values skipped)."""
    for name in names:
        field = model.model_fields.get(name)
        pending = [field.annotation] if field is not None else []
        while pending:
            kind = pending.pop()
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                model = kind
                break
            pending.extend(get_args(kind))
    return list(model.model_fields)


def format_key(key_path: KeyPath) -> str:
    """('mcps', 'github', 'args', 1) -> 'mcps.github.args[1]'."""
    text = ""
    for part in key_path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text
