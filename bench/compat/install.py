"""Install the matrix's servers and clients at their pinned versions into a cache directory.

- PyPI: one venv per server (or client) under `<cache>/venvs/<id>`, because many pin the
  Python SDK 1.x, which cannot sit beside the gateway's 2.x.
- npm: every package into one prefix, `<cache>/npm/node_modules`.

The cache is `$MCP_GATEWAY_COMPAT_CACHE`, else `~/.cache/mcp-gateway-compat`. An install that
is already there (same pinned requirements) is not redone. Every install is bounded in time.

    python -m bench.compat.install            # everything
    python -m bench.compat.install --fast     # what the test suite uses
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from bench.compat.servers import CLIENTS, SERVERS, CompatServer

__all__ = [
    "InstallError",
    "RegistryUnreachable",
    "cache_dir",
    "client_python",
    "exit_reason",
    "failure_output",
    "install_clients",
    "install_servers",
    "npm_bin",
    "run_step",
    "server_command",
]

PIP_TIMEOUT = 600.0
NPM_TIMEOUT = 900.0
_NETWORK_SIGNS = (
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNREFUSED",
    "ETIMEDOUT",
    "ENETUNREACH",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "No matching distribution found",
    "Could not fetch URL",
    "ConnectTimeout",
)


class InstallError(RuntimeError):
    """An install failed for a reason of its own (not an unreachable registry)."""


class RegistryUnreachable(InstallError):
    """The package registry (or Node itself) is not there: the caller skips, it does not fail."""


def cache_dir() -> Path:
    return Path(os.environ.get("MCP_GATEWAY_COMPAT_CACHE") or Path.home() / ".cache" / "mcp-gateway-compat")


def _venv(cache: Path, name: str) -> Path:
    return cache / "venvs" / name


def server_command(server: CompatServer, cache: Path) -> str:
    """The executable that starts `server` from the cache."""
    if server.registry == "pypi":
        return str(_venv(cache, server.id) / "bin" / server.command)
    return str(npm_bin(cache, server.command))


def npm_bin(cache: Path, name: str) -> Path:
    return cache / "npm" / "node_modules" / ".bin" / name


def client_python(cache: Path, client_id: str) -> Path:
    return _venv(cache, f"client-{client_id}") / "bin" / "python"


_NOISE = re.compile(r"^WARNING: Location '[^']*' is ignored: it is neither a file nor a directory\.$")
"""pip's line for each missing `find-links` directory of the machine's pip configuration: one per
package looked up, so dozens of them would fill a failure's tail and hide its cause."""
SHOWN = 1500
"""The most characters of an install's output a failure carries."""


def exit_reason(returncode: int) -> str:
    """An exit code as a person reads it: a negative one is the signal that ended the process."""
    if returncode >= 0:
        return f"exit {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    if -returncode == signal.SIGKILL:
        return f"killed by {name} (exit {returncode}): often the kernel's out-of-memory killer; see `dmesg`"
    return f"ended by {name} (exit {returncode})"


def failure_output(output: str, limit: int = SHOWN) -> str:
    """The part of a failed install's output that says why: without pip's ignored-location noise, its
    `ERROR:` lines kept, then as much of the rest's end as fits."""
    lines = [line for line in output.splitlines() if line.strip() and not _NOISE.match(line.strip())]
    errors = [line for line in lines if line.startswith(("ERROR:", "npm ERR!", "npm error"))]
    text = "\n".join(errors) if errors else ""
    rest = "\n".join(line for line in lines if line not in errors)
    if rest and len(text) < limit:
        room = limit - len(text)
        text = (rest[-room:] + ("\n" + text if text else "")).strip()
    return text[-limit:] or "(no output but pip's ignored-location warnings)"


def run_step(args: Sequence[str], timeout: float, what: str, cwd: Path | None = None) -> None:
    """Run one install command; a failure is an `InstallError` with its exit (or signal) and its cause."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired as exc:
        raise InstallError(f"{what}: no result within {timeout:.0f} s") from exc
    if done.returncode != 0:
        output = failure_output(done.stdout + "\n" + done.stderr)
        kind = RegistryUnreachable if any(sign in output for sign in _NETWORK_SIGNS) else InstallError
        raise kind(f"{what} failed ({exit_reason(done.returncode)}):\n{output}")


def _install_venv(cache: Path, name: str, requirements: Sequence[str]) -> None:
    """A venv at `<cache>/venvs/<name>` holding exactly `requirements` (redone when they change)."""
    venv = _venv(cache, name)
    marker = venv / ".compat-requirements"
    wanted = "\n".join(requirements)
    if marker.exists() and marker.read_text() == wanted:
        return
    if venv.exists():
        shutil.rmtree(venv)
    run_step([sys.executable, "-m", "venv", "--without-pip", str(venv)], 120, f"venv for {name}")
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install"]
    run_step(
        [*pip, "-q", "--disable-pip-version-check", *requirements], PIP_TIMEOUT, f"pip install {' '.join(requirements)}"
    )
    marker.write_text(wanted)


def _npm_installed(cache: Path, requirement: str) -> bool:
    name, _, version = requirement.rpartition("@")
    manifest = cache / "npm" / "node_modules" / name / "package.json"
    return manifest.exists() and json.loads(manifest.read_text()).get("version") == version


def _install_npm(cache: Path, requirements: Iterable[str]) -> None:
    missing = [r for r in requirements if not _npm_installed(cache, r)]
    if not missing:
        return
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise RegistryUnreachable("Node.js (node and npm) is not installed; scripts/test installs it from Debian")
    prefix = cache / "npm"
    prefix.mkdir(parents=True, exist_ok=True)
    if not (prefix / "package.json").exists():
        (prefix / "package.json").write_text('{"private": true}\n')
    args = [npm, "install", "--no-audit", "--no-fund", "--loglevel=error", *missing]
    run_step(args, NPM_TIMEOUT, f"npm install {' '.join(missing)}", cwd=prefix)


def _parallel(jobs: Sequence[tuple[str, Sequence[str]]], cache: Path) -> None:
    """Install venvs three at a time; raise the first error (a registry error first: it explains the rest)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = [pool.submit(_install_venv, cache, name, reqs) for name, reqs in jobs]
        errors = [f.exception() for f in futures if f.exception() is not None]
    errors.sort(key=lambda e: not isinstance(e, RegistryUnreachable))
    if errors:
        raise errors[0]  # type: ignore[misc]


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One installer at a time per cache (parallel test workers share it)."""
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def install_servers(servers: Sequence[CompatServer], cache: Path | None = None) -> Path:
    """Install `servers` into the cache (the default one unless given); return the cache."""
    cache = cache or cache_dir()
    with _locked(cache):
        _parallel([(s.id, [s.requirement, *s.pins]) for s in servers if s.registry == "pypi"], cache)
        _install_npm(cache, [s.requirement for s in servers if s.registry == "npm"])
    return cache


def install_clients(cache: Path | None = None) -> Path:
    """Install the third-party clients (each PyPI one in its venv, the npm ones in the prefix)."""
    cache = cache or cache_dir()
    with _locked(cache):
        _parallel([(f"client-{c.id}", [c.requirement]) for c in CLIENTS if c.registry == "pypi"], cache)
        _install_npm(cache, [c.requirement for c in CLIENTS if c.registry == "npm"])
    return cache


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", action="store_true", help="only the servers the test suite uses")
    args = parser.parse_args(argv)
    servers = [s for s in SERVERS if s.fast or not args.fast]
    cache = install_servers(servers)
    install_clients(cache)
    print(f"installed {len(servers)} servers and {len(CLIENTS)} clients into {cache}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
