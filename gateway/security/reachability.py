"""Reachable means authenticated: when a gateway without `auth:` can be reached beyond loopback.

A gateway with no `auth:` is safe only while nobody but this machine's own users can reach
it. What shows that others can, checked at start and on every request:

- at start (`beyond_loopback`): a bind address that is not loopback, Host names or Origins
  allowed besides loopback ones (what a reverse proxy on the same host needs: it passes the
  public name), or trusted proxies;
- per request (`request_beyond_loopback`): proxy headers (`Forwarded`, `X-Forwarded-*`,
  `X-Real-IP`), a client address that is not loopback, or a Host that is not a loopback name.

A proxy that rewrites Host to a loopback name and adds no forwarding header makes a remote
request look local; docs/deployment.md's recipes set both, and `auth:` is the cure either way.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

from gateway.config.runtime_settings import HttpSettings

__all__ = [
    "FORWARDING_HEADERS",
    "FORWARDING_NAMES",
    "beyond_loopback",
    "how_to_add_auth",
    "is_loopback",
    "no_auth_refusal",
    "request_beyond_loopback",
]

FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-real-ip")
"""Headers a reverse proxy adds: their presence says the request came through one."""

FORWARDING_NAMES = frozenset(name.encode() for name in FORWARDING_HEADERS)
"""`FORWARDING_HEADERS` as ASGI names (lower-case bytes)."""
_LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


@functools.lru_cache(maxsize=1024)
def is_loopback(host: str) -> bool:
    """A loopback name or address, with or without a port or the `:*` of an allowed-host pattern.

    Cached: every request without `auth:` asks it of its client address and Host, which repeat
    (parsing one costs about 15 us on the CI machine; bench/drain_overhead.py)."""
    host = host.strip().lower()
    if host.startswith("["):  # [::1]:8765
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:  # name:port, 127.0.0.1:*
        host = host.split(":", 1)[0]
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin_host(origin: str) -> str:
    return urlsplit(origin).netloc if "://" in origin else origin


def beyond_loopback(http: HttpSettings) -> list[str]:
    """Why the settings make this gateway reachable beyond loopback (empty: they do not)."""
    reasons = []
    if not is_loopback(http.host):
        reasons.append(f"it listens on {http.host}")
    hosts = [h for h in http.allowed_hosts if not is_loopback(h)]
    if hosts:
        reasons.append(f"GATEWAY_HTTP__ALLOWED_HOSTS accepts {', '.join(hosts)}")
    origins = [o for o in http.allowed_origins if not is_loopback(_origin_host(o))]
    if origins:
        reasons.append(f"GATEWAY_HTTP__ALLOWED_ORIGINS accepts {', '.join(origins)}")
    if http.trusted_proxies:
        reasons.append(f"GATEWAY_HTTP__TRUSTED_PROXIES trusts {', '.join(http.trusted_proxies)}")
    return reasons


def request_beyond_loopback(headers: Mapping[str, str], client: Iterable[object] | None) -> str | None:
    """Why this request shows that it came from beyond loopback (None: it looks local).

    `headers` with lower-case names (starlette's `Headers`); `client` the ASGI scope's (host, port)."""
    raw = getattr(headers, "raw", None)  # starlette's Headers: one pass over the (lower-case) names
    names = [name for name, _ in raw] if raw is not None else [name.encode("latin-1") for name in headers]
    for name in names:
        if name in FORWARDING_NAMES:
            return f"it came through a proxy (its {name.decode('latin-1')} header)"
    if client is not None:
        address = str(next(iter(client), ""))
        if address and not is_loopback(address):
            return f"it came from {address}"
    host = headers.get("host")
    if host and not is_loopback(host):
        return f"it was sent to {host}"
    return None


def how_to_add_auth(config: Path) -> str:
    """The sentences that tell an operator how to put authentication in front of everything."""
    return (
        f"Add an `auth:` section to {config}: run `mcp-gateway keys new` and put the hash under "
        "auth.api_keys (or configure auth.jwt; see docs/security.md). Only if a proxy in front of the "
        "gateway authenticates every caller, set GATEWAY_HTTP__INSECURE_NO_AUTH=true (or serve --insecure-no-auth)."
    )


def no_auth_refusal(why: str, config: Path) -> str:
    """What a gateway without `auth:` says to a request from beyond loopback, and how to fix it."""
    return (
        f"This gateway has no authentication but is reachable beyond loopback ({why}), so it serves no one "
        f"there. {how_to_add_auth(config)}"
    )
