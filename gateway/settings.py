"""Gateway-wide settings, from the environment (`GATEWAY_*`, nested with `__`) and `.env`.

The YAML file (`gateway.config`) says *which* servers sit behind the gateway; these
settings say *how* the gateway itself runs. Keeping them apart lets an operator
change ports, paths or limits per deployment without touching the shared YAML.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["HttpSettings", "PluginSettings", "Settings", "default_data_dir"]


def default_data_dir() -> Path:
    """`$XDG_DATA_HOME/mcp-gateway`, or `~/.local/share/mcp-gateway`."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mcp-gateway"


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
    stateless: bool = False


class PluginSettings(BaseModel):
    """Which plugins may load. Names are plugin names as `mcp-gateway plugins` prints them."""

    allow: list[str] = Field(default_factory=list, description="If non-empty, only these plugins load.")
    deny: list[str] = Field(default_factory=list, description="These plugins never load.")
    directory: Path | None = Field(
        default=None, description="Where `plugins/<name>/` directories are searched; default: ./plugins."
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
    data_dir: Path = Field(default_factory=default_data_dir)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    startup_timeout: float = Field(
        default=30.0, gt=0, description="Seconds a server may take to connect before it is marked failed."
    )
    call_timeout: float = Field(
        default=60.0, gt=0, description="Default seconds per proxied request, unless a server sets `timeout`."
    )
    list_wait: float = Field(
        default=5.0,
        ge=0,
        description="Seconds a list request made at start-up waits for servers that are still connecting.",
    )
    page_size: int = Field(
        default=500, ge=1, le=10_000, description="Items per page in the gateway's own list responses."
    )
    http: HttpSettings = Field(default_factory=HttpSettings)
    plugins: PluginSettings = Field(default_factory=PluginSettings)
