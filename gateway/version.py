"""The installed mcp-gateway version, as `--version` prints it and upstreams and clients are told it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

__all__ = ["gateway_version", "installed_version"]


def installed_version() -> str | None:
    """The version of the installed distribution; None when run from a source tree never installed."""
    try:
        return version("mcp-gateway")
    except PackageNotFoundError:
        return None


def gateway_version() -> str:
    """The installed mcp-gateway version, announced to upstreams and clients ("0" if not installed)."""
    return installed_version() or "0"
