"""Load the YAML file that declares the external MCP servers behind the gateway.

People edit this file by hand, so every problem is reported as one `ConfigError`
naming the file, the line and the key path (`external-mcps.yaml:12: mcps.github.url: ...`)
instead of a traceback.

This module is the way in: reading the file, and validating the plugin sections later against each
plugin's own model. The rules of the file are the parser's (`gateway.config.parser`); what it
parses to and its errors are `gateway.config.gateway_config`'s, re-exported here as the API.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel

from gateway.config.gateway_config import ConfigError, GatewayConfig, MissingVariable, UnusableServer, validate_section
from gateway.config.parser import Parser
from gateway.config.servers import ServerConfig, ToolFilter

__all__ = [
    "DEFAULT_CONFIG_NAME",
    "ConfigError",
    "GatewayConfig",
    "MissingVariable",
    "ServerConfig",
    "UnusableServer",
    "ToolFilter",
    "PLUGIN_OPTIONS_KEY",
    "load_config",
    "validate_plugin_options",
    "validate_plugin_settings",
    "parse_config",
]

DEFAULT_CONFIG_NAME = "external-mcps.yaml"

PLUGIN_OPTIONS_KEY = "gateway"
"""`plugins.<name>.gateway:` holds the gateway's options for the plugin's servers (timeouts, isolation);
the plugin's own `Config` never sees it."""
M = TypeVar("M", bound=BaseModel)


def validate_plugin_settings(config: GatewayConfig, name: str, model: type[M]) -> M:
    """Validate the `plugins.<name>` section against the plugin's pydantic `model`.

    A problem is one `ConfigError` naming the file, the line and the key
    (`external-mcps.yaml:14: plugins.openapi.specs[0].url: Field required`).
    """
    own = {key: value for key, value in config.plugins.get(name, {}).items() if key != PLUGIN_OPTIONS_KEY}
    return validate_section(model, own, ("plugins", name), config.path, config.line_of)


def validate_plugin_options(config: GatewayConfig, name: str, model: type[M]) -> M:
    """Validate `plugins.<name>.gateway`, the gateway's own options for a plugin's servers, like any section."""
    raw = config.plugins.get(name, {}).get(PLUGIN_OPTIONS_KEY, {})
    return validate_section(model, raw, ("plugins", name, PLUGIN_OPTIONS_KEY), config.path, config.line_of)


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read and validate the file at `path`; `environ` (default: os.environ) feeds credentials and ${VAR}."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(
            path,
            "file does not exist (create it, or choose another file with --config PATH or GATEWAY_CONFIG)",
        )
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ConfigError(path, "file is not valid UTF-8") from None
    except OSError as exc:
        raise ConfigError(path, f"cannot read file: {exc.strerror or exc}") from None
    return parse_config(text, path, environ)


def parse_config(text: str, path: Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Validate config `text`; `path` is only used in error messages and to detect JSON."""
    path = Path(path)
    if path.suffix.lower() == ".json":
        text = text.replace("\t", " ")  # valid JSON has tabs only as whitespace, which YAML refuses
    return Parser(path, os.environ if environ is None else environ).parse(text)
