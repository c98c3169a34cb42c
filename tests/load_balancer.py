"""Debian's nginx as a round-robin load balancer on 127.0.0.1, in front of gateway replicas.

`scripts/test` installs nginx (apt_install). `start_balancer(ports, home)` writes a config that
sends each request to the next replica (round robin, no affinity, keep-alive off so every request
is balanced on its own; `resend=True` resends a request that a replica refused or dropped to the next
one, as docs/deployment.md's config does), starts nginx in the foreground as a child process and waits until it
answers; `stop_balancer` stops it. Use from a test module with `pytest_plugins = ["tests.load_balancer"]`
or by importing the functions.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import START_DEADLINE

__all__ = ["Balancer", "nginx_binary", "start_balancer", "stop_balancer"]

START_TIMEOUT = START_DEADLINE  # tests/conftest.py: a bound on a hang, not a speed


@dataclass
class Balancer:
    process: subprocess.Popen[bytes]
    port: int
    home: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        path = self.home / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


def nginx_binary() -> str:
    """The path of Debian's nginx; a clear error when it is not installed."""
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if found is None:
        raise RuntimeError("these tests need Debian's nginx (scripts/test installs it: apt-get install nginx)")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_balancer(
    ports: list[int], home: Path, *, resend: bool = False, host_header: str = "$http_host", forwarded: bool = False
) -> Balancer:
    """nginx on a free port of 127.0.0.1, round robin over `ports` (HTTP/1.1, responses streamed).

    `resend`: `proxy_next_upstream error timeout http_503 non_idempotent` (a refused connection, a
    dropped one or a draining replica's 503 goes to the next replica, POSTs too); else `off`.
    `host_header`: what nginx sends as Host (`$http_host`: the client's; `$proxy_host`: the upstream's
    loopback address). `forwarded`: the `X-Forwarded-For`/`-Proto` headers a production recipe sets."""
    home.mkdir(parents=True, exist_ok=True)
    next_upstream = "error timeout http_503 non_idempotent" if resend else "off"
    forwarding = (
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n"
        "                        proxy_set_header X-Forwarded-Proto $scheme;"
        if forwarded
        else ""
    )
    port = _free_port()
    servers = "\n".join(f"        server 127.0.0.1:{p} max_fails=0;" for p in ports)
    (home / "nginx.conf").write_text(
        textwrap.dedent(
            f"""
            daemon off;
            worker_processes 1;
            pid {home}/nginx.pid;
            error_log {home}/error.log warn;
            events {{ worker_connections 256; }}
            http {{
                access_log off;
                client_body_temp_path {home}/body;
                proxy_temp_path {home}/proxy;
                fastcgi_temp_path {home}/fastcgi;
                uwsgi_temp_path {home}/uwsgi;
                scgi_temp_path {home}/scgi;
                upstream replicas {{
            {servers}
                }}
                server {{
                    listen 127.0.0.1:{port};
                    location / {{
                        proxy_pass http://replicas;
                        proxy_http_version 1.1;
                        proxy_set_header Host {host_header};
                        proxy_set_header Connection "";
                        {forwarding}
                        proxy_buffering off;
                        proxy_read_timeout 120s;
                        proxy_next_upstream {next_upstream};
                    }}
                }}
            }}
            """
        )
    )
    process = subprocess.Popen(
        [nginx_binary(), "-p", str(home), "-c", str(home / "nginx.conf"), "-e", str(home / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    balancer = Balancer(process, port, home)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited at start-up:\n{balancer.log[-3000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return balancer
        except OSError:
            if time.monotonic() > deadline:
                stop_balancer(balancer)
                raise RuntimeError(f"nginx did not listen in {START_TIMEOUT} s:\n{balancer.log[-3000:]}") from None
            time.sleep(0.05)


def stop_balancer(balancer: Balancer) -> None:
    """SIGQUIT (graceful), then SIGKILL if it lingers."""
    if balancer.process.poll() is None:
        balancer.process.send_signal(signal.SIGQUIT)
        try:
            balancer.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            balancer.process.kill()
            balancer.process.wait(timeout=10)
