"""Debian's nginx as a reverse proxy in front of gateways, for tests: a child process on 127.0.0.1.

`scripts/test` installs the `nginx` package when it can. nginx runs in the foreground without a
master process (`daemon off; master_process off;`), from a temporary prefix holding its config,
temporary files and error log, listening on a free port of 127.0.0.1, and proxies to the given
ports round robin with the headers a production recipe sets (docs/deployment.md): the client's
Host, `X-Forwarded-For`, `X-Forwarded-Proto`, no buffering.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NGINX", "Nginx", "nginx_proxy"]

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
START_TIMEOUT = 20.0


@dataclass
class Nginx:
    process: subprocess.Popen[bytes]
    port: int
    prefix: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        path = self.prefix / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(port: int, upstream_ports: list[int], prefix: Path, host_header: str) -> str:
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in upstream_ports)
    return textwrap.dedent(
        f"""\
        daemon off;
        master_process off;
        worker_processes 1;
        pid {prefix}/nginx.pid;
        error_log {prefix}/error.log warn;
        events {{ worker_connections 256; }}
        http {{
            access_log off;
            client_body_temp_path {prefix}/client_body;
            proxy_temp_path {prefix}/proxy;
            fastcgi_temp_path {prefix}/fastcgi;
            uwsgi_temp_path {prefix}/uwsgi;
            scgi_temp_path {prefix}/scgi;
            upstream gateway {{
        {servers}
                keepalive 8;
            }}
            server {{
                listen 127.0.0.1:{port};
                location / {{
                    proxy_pass http://gateway;
                    proxy_http_version 1.1;
                    proxy_set_header Connection "";
                    proxy_set_header Host {host_header};
                    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
                    proxy_set_header X-Forwarded-Proto $scheme;
                    proxy_buffering off;
                    proxy_read_timeout 60s;
                }}
            }}
        }}
        """
    )


@contextmanager
def nginx_proxy(home: Path, upstream_ports: list[int], *, host_header: str = "$http_host") -> Iterator[Nginx]:
    """nginx proxying `127.0.0.1:<port>` to the gateways on `upstream_ports`, stopped on exit.

    `host_header`: what nginx sends as Host (`$http_host`: the client's, with its port; `$proxy_host`: the upstream's
    address, a loopback name)."""
    if not Path(NGINX).exists():
        raise RuntimeError("nginx is not installed: `scripts/test` installs Debian's nginx package (apt)")
    prefix = home / "nginx"
    prefix.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    config = prefix / "nginx.conf"
    config.write_text(_config(port, upstream_ports, prefix, host_header))
    process = subprocess.Popen(
        [NGINX, "-p", str(prefix), "-c", str(config), "-e", str(prefix / "error.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proxy = Nginx(process, port, prefix)
    try:
        _wait_listening(proxy)
        yield proxy
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def _wait_listening(proxy: Nginx) -> None:
    """Until nginx accepts connections (it prints nothing when it does), bounded."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if proxy.process.poll() is not None:
            raise RuntimeError(f"nginx exited with {proxy.process.returncode}: {proxy.error_log()}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", proxy.port)) == 0:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nginx did not listen on {proxy.port} within {START_TIMEOUT} s: {proxy.error_log()}")
        time.sleep(0.05)
