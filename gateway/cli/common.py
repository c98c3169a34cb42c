"""What every `mcp-gateway` command shares: settings from the command line, logging, loading the
config into a registry, exit codes, and the usage error that is one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from gateway.config.loader import GatewayConfig, load_config
from gateway.config.settings import Settings, describe_settings_error
from gateway.observability.logs import JsonFormatter
from gateway.plugins import PluginManager, get_plugin_manager
from gateway.records.service import SQLITE_FILE, open_store
from gateway.records.store import RecordStore
from gateway.registry import Registry
from gateway.security.vetting import ToolVetter
from gateway.server_specs import check_plugin_sections, specs_from_config, specs_from_plugins
from gateway.state.deployment import fingerprint_store

__all__ = [
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "Usage",
    "configure_logging",
    "global_options",
    "load",
    "recorded_store",
    "settings_from",
    "with_registry",
]

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 130

T = TypeVar("T")


class Usage(Exception):
    """A bad command line: message to stderr, exit 2."""


def global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    """--config and --log-level: given before the command or after it; the later one wins, as a repeated option."""
    parser.add_argument(
        "--config", type=Path, default=default, help="YAML server list (default: $GATEWAY_CONFIG or external-mcps.yaml)"
    )
    parser.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default=default,
        help="default: $GATEWAY_LOG_LEVEL, else INFO for serve and WARNING for the other commands",
    )


ONE_SHOT_LOG_LEVEL = "WARNING"
"""The log level of every command but `serve` unless one is given (`--log-level`, `GATEWAY_LOG_LEVEL`,
`.env`): a one-shot command prints its result, not the start and stop of every server around it."""


def settings_from(args: argparse.Namespace) -> Settings:
    try:
        settings = Settings()
    except ValidationError as exc:  # GATEWAY_* variables or .env
        raise Usage(f"settings error: {describe_settings_error(exc)}") from None
    updates: dict[str, Any] = {}
    if getattr(args, "command", "serve") != "serve" and "log_level" not in settings.model_fields_set:
        updates["log_level"] = ONE_SHOT_LOG_LEVEL
    if args.config is not None:
        settings = settings.with_config(args.config)  # an unnamed data dir is the config's own
    if args.log_level is not None:
        updates["log_level"] = args.log_level
    http_updates = {
        k: v for k, v in (("host", getattr(args, "host", None)), ("port", getattr(args, "port", None))) if v is not None
    }
    if getattr(args, "insecure_no_auth", False):
        http_updates["insecure_no_auth"] = True
    if http_updates:
        updates["http"] = settings.http.model_copy(update=http_updates)
    if getattr(args, "mode", None) is not None:
        updates["routing"] = settings.routing.model_copy(update={"mode": args.mode})
    return settings.model_copy(update=updates)


def configure_logging(settings: Settings) -> None:
    """Log to stderr (stdout carries the MCP protocol under `serve --transport stdio`), as text or, with
    `GATEWAY_LOG_FORMAT=json`, one JSON object per line (`gateway.observability.logs`)."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(settings.replica_id))
        logging.captureWarnings(True)  # a Python warning is a log line too, not a line of plain text
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=settings.log_level, handlers=[handler])
    for noisy in ("httpx", "httpx2", "mcp", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


def load(settings: Settings, *, serving: bool) -> tuple[GatewayConfig, Registry, PluginManager, ToolVetter]:
    config = load_config(settings.config)
    pm, infos = get_plugin_manager(settings, config.plugin_directories)
    check_plugin_sections(config, [info.name for info in infos])
    specs = specs_from_plugins(pm, settings, config) + specs_from_config(config, settings)
    # Only `serve` has a client to relay sampling, elicitation and roots requests to.
    registry = Registry(specs, settings, relay_requests=serving, plugins=pm)
    store = fingerprint_store(settings.database_url, settings.data_dir, settings.replica_id)
    vetter = ToolVetter(store, config.security)
    registry.listing_filter = vetter.vet
    registry.withheld = vetter.withheld
    return config, registry, pm, vetter


async def with_registry(registry: Registry, body: Callable[[Registry], Awaitable[T]]) -> T:
    async with registry.running():
        await registry.wait_settled(registry.settings.startup_timeout + 5)
        return await body(registry)


def recorded_store(settings: Settings) -> RecordStore | None:
    """The records a serving gateway learns from, for one-shot commands; None if there are none yet."""
    if not (settings.records.enabled and settings.learning.enabled):
        return None
    if settings.database_url is None and not (settings.data_dir / SQLITE_FILE).exists():
        return None
    return open_store(settings)
