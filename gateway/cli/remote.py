"""Commands that act on a running gateway: how they find it, and `mcp-gateway reload`.

`serve` writes a small runtime file in the data dir (`RUNTIME_FILE`: its pid and, over HTTP,
its base URL) and removes it on exit. The data dir, unless named, is the config's own
(`deployment_data_dir`), so a command finds the gateway serving the config it was given.
`servers restart|disable|enable`, `tools approve` and `reload` read it and talk to that gateway
through the admin API (`/admin/api/v1/`), with the admin key from `--key` or `GATEWAY_ADMIN_KEY`
(a gateway without `auth:` needs none: it serves the console on loopback). `reload` of a stdio
gateway (a pid, no URL) sends it SIGHUP. A runtime file whose process is gone is ignored (a
gateway killed with SIGKILL leaves one).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from gateway.cli.common import EXIT_FAILED, EXIT_OK, Usage
from gateway.config.settings import Settings

__all__ = [
    "ADMIN_KEY_ENV",
    "RUNTIME_FILE",
    "RemoteError",
    "Runtime",
    "add_key_option",
    "add_parsers",
    "admin_call",
    "no_gateway_running",
    "remove_runtime",
    "running_gateway",
    "write_runtime",
]

RUNTIME_FILE = "gateway.runtime.json"
ADMIN_KEY_ENV = "GATEWAY_ADMIN_KEY"
API = "/admin/api/v1"


class RemoteError(Exception):
    """The running gateway refused or could not be reached; the message says which and why."""


@dataclass(frozen=True)
class Runtime:
    pid: int
    url: str | None
    """The HTTP base URL (`http://127.0.0.1:8765`); None for a stdio gateway."""


def write_runtime(settings: Settings, url: str | None) -> Path:
    """Say that this process serves (and where), for the commands that act on a running gateway."""
    path = settings.data_dir / RUNTIME_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"pid": os.getpid(), "url": url}) + "\n", encoding="utf-8")
    temporary.replace(path)
    return path


def remove_runtime(settings: Settings) -> None:
    """Remove the runtime file if this process wrote it (another gateway may have written it since)."""
    path = settings.data_dir / RUNTIME_FILE
    found = _read(path)
    if found is not None and found.pid == os.getpid():
        path.unlink(missing_ok=True)


def _read(path: Path) -> Runtime | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Runtime(int(data["pid"]), data.get("url") or None)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def running_gateway(settings: Settings) -> Runtime | None:
    """The gateway serving with this data dir, if one is running."""
    found = _read(settings.data_dir / RUNTIME_FILE)
    return found if found is not None and _alive(found.pid) else None


def no_gateway_running(settings: Settings) -> str:
    """Why a command that acts on a running gateway has none to act on: which one it looked for."""
    named = "" if settings.data_dir_named else f" (its data dir for the config {settings.config})"
    return (
        f"no running gateway uses the data dir {settings.data_dir}{named}: start one with `mcp-gateway serve`, "
        "or give the config (--config) or GATEWAY_DATA_DIR the running one was started with"
    )


def add_key_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--key", help=f"the admin API key of the running gateway (default: ${ADMIN_KEY_ENV})")


def admin_call(runtime: Runtime, method: str, path: str, key: str | None) -> dict[str, Any]:
    """One admin API request to a running gateway; its JSON answer, or `RemoteError` with its message."""
    if runtime.url is None:
        raise RemoteError(f"the running gateway (pid {runtime.pid}) serves stdio: it has no admin API")
    key = key or os.environ.get(ADMIN_KEY_ENV)
    # Without `auth:` the gateway accepts any bearer on loopback; the header marks an API call (no CSRF token).
    headers = {"Authorization": f"Bearer {key or 'local'}"}
    try:
        response = httpx2.request(method, runtime.url + API + path, headers=headers, timeout=60)
    except httpx2.HTTPError as exc:
        raise RemoteError(f"cannot reach the gateway at {runtime.url}: {exc}") from None
    try:
        body = response.json()
    except ValueError:
        body = {"message": response.text.strip()[:300]}
    if response.status_code >= 400:
        message = body.get("message") or body.get("error_description") or body.get("error") or response.reason_phrase
        hint = (
            f" (give the admin key with --key or ${ADMIN_KEY_ENV})" if response.status_code == 401 and not key else ""
        )
        raise RemoteError(f"the gateway at {runtime.url} answered {response.status_code}: {message}{hint}")
    return body if isinstance(body, dict) else {"answer": body}


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    reload = commands.add_parser("reload", help="make the running gateway reload its config file now")
    add_key_option(reload)
    reload.add_argument("--json", action="store_true", help="print the reload report as JSON")
    reload.set_defaults(run=run_reload)


def run_reload(args: argparse.Namespace, settings: Settings) -> int:
    runtime = running_gateway(settings)
    if runtime is None:
        raise Usage(no_gateway_running(settings))
    if runtime.url is None:
        os.kill(runtime.pid, signal.SIGHUP)
        print(f"sent SIGHUP to the stdio gateway (pid {runtime.pid}); its log shows the outcome", file=sys.stderr)
        return EXIT_OK
    try:
        report = admin_call(runtime, "POST", "/reload", args.key)
    except RemoteError as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for kind in ("added", "removed", "changed", "unchanged", "needs_restart"):
            names = report.get(kind) or []
            if names:
                print(f"{kind}: {', '.join(str(n) for n in names)}")
    return EXIT_OK
