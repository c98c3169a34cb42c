"""Debian's nginx as a reverse proxy in front of gateways, for tests: `tests/load_balancer.py`'s
nginx with the headers a production recipe sets (docs/deployment.md): the client's Host (or the
upstream's), `X-Forwarded-For`, `X-Forwarded-Proto`, no buffering.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.load_balancer import Balancer, nginx_binary, start_balancer, stop_balancer

__all__ = ["nginx_binary", "nginx_proxy"]


@contextmanager
def nginx_proxy(home: Path, upstream_ports: list[int], *, host_header: str = "$http_host") -> Iterator[Balancer]:
    """nginx proxying `127.0.0.1:<port>` to the gateways on `upstream_ports`, stopped on exit."""
    proxy = start_balancer(upstream_ports, home / "nginx", host_header=host_header, forwarded=True)
    try:
        yield proxy
    finally:
        stop_balancer(proxy)
