"""The last listing of an on-demand server, kept on disk so the gateway need not start it to list it.

A server declared `start: on_demand` is started by its first call. Its tools must still be
listed and searchable before that, so its listing is saved after each connection and read
back at start-up. The file is keyed by a fingerprint of how the server is started
(command, arguments, directory, the names of its environment variables — never their
values): change any of those and the stale listing is ignored, and the server is started
once to list it again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import mcp_types as types
from mcp import StdioServerParameters

from gateway.catalog import ServerListing

__all__ = ["fingerprint", "load_listing", "save_listing"]

logger = logging.getLogger(__name__)


def fingerprint(params: StdioServerParameters) -> str:
    """A stable hash of how a stdio server is started, free of secret values."""
    shape = [params.command, list(params.args), str(params.cwd or ""), sorted((params.env or {}).keys())]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:32]


def _path(directory: Path, server_id: str) -> Path:
    return directory / f"{server_id}.json"


def save_listing(directory: Path, listing: ServerListing, key: str) -> None:
    """Write atomically (a crash mid-write leaves the previous file); a failure is only logged."""
    payload = {
        "fingerprint": key,
        "tools": [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in listing.tools],
        "prompts": [p.model_dump(by_alias=True, mode="json", exclude_none=True) for p in listing.prompts],
        "resources": [r.model_dump(by_alias=True, mode="json", exclude_none=True) for r in listing.resources],
        "templates": [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in listing.templates],
    }
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=directory, delete=False, suffix=".tmp", encoding="utf-8") as f:
            json.dump(payload, f)
        os.replace(f.name, _path(directory, listing.server_id))
    except OSError as exc:
        logger.warning("could not save the listing of server %r: %s", listing.server_id, exc)


def load_listing(directory: Path, server_id: str, prefix: str, key: str) -> ServerListing | None:
    """The saved listing, or None when there is none, it is unreadable, or the server changed."""
    path = _path(directory, server_id)
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
        if payload.get("fingerprint") != key:
            return None
        return ServerListing(
            server_id,
            prefix,
            [types.Tool.model_validate(t) for t in payload["tools"]],
            [types.Prompt.model_validate(p) for p in payload["prompts"]],
            [types.Resource.model_validate(r) for r in payload["resources"]],
            [types.ResourceTemplate.model_validate(t) for t in payload["templates"]],
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("ignoring the saved listing of server %r (%s): %s", server_id, path, exc)
        return None
