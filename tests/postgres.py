"""A real PostgreSQL server on 127.0.0.1 for tests, started and stopped by a pytest fixture.

The server binaries are Debian's (the `postgresql` package, which `scripts/test`
installs when it can: /usr/lib/postgresql/<version>/bin, the newest version found), or
else those of the `pgserver` package (PyPI, in the test extra), which ships PostgreSQL
16 for Linux and macOS; only its binaries are used, not its Python API (which changes
the permissions of every parent directory when run as root).
PostgreSQL refuses to run as root, so as root the server runs as the `nobody` user,
from a copy of the binaries that user can read when the installed ones are out of its
reach. One server serves the whole test session (start-up takes about a second);
each test gets its own database from `postgres_database`.

Use it from a test module with:

    pytest_plugins = ["tests.postgres"]
"""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import START_DEADLINE

__all__ = ["PostgresServer", "postgres_database", "postgres_server", "start_postgres", "stop_postgres"]

START_TIMEOUT = START_DEADLINE  # tests/conftest.py: a bound on a hang, not a speed
RUN_AS_WHEN_ROOT = "nobody"


@dataclass
class PostgresServer:
    """A running server: connect as `user` with `password` to 127.0.0.1:`port`."""

    process: subprocess.Popen[bytes]
    port: int
    user: str
    password: str
    home: Path
    """The temporary directory holding the data directory, the log and (as root) the binaries."""
    binaries: Path
    """The installation the server runs from (its `bin/` holds `postgres`)."""

    def url(self, database: str = "postgres") -> str:
        """A URL without the password (give it separately, as the sql plugin's password_env does)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def url_with_password(self, database: str = "postgres") -> str:
        """A URL with the password in it, as `GATEWAY_DATABASE_URL` takes it."""
        return f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/{database}"

    def connect(self, database: str = "postgres", **kwargs: Any) -> Any:
        import psycopg

        return psycopg.connect(self.url(database), password=self.password, **kwargs)

    @property
    def log(self) -> str:
        path = self.home / "postgres.log"
        return path.read_text(errors="replace") if path.exists() else ""


DEBIAN_INSTALLS = "/usr/lib/postgresql/*"


def _debian_binaries() -> Path | None:
    """The newest PostgreSQL installed from Debian's packages, if any."""
    installs = [p for p in Path("/").glob(DEBIAN_INSTALLS.lstrip("/")) if (p / "bin" / "postgres").is_file()]
    versions = [(int(p.name), p) for p in installs if p.name.isdigit()]
    return max(versions)[1] if versions else None


def _pgserver_binaries() -> Path:
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the PostgreSQL test server needs the pgserver package: pip install -e '.[test]'")
    install = Path(next(iter(spec.submodule_search_locations))) / "pginstall"
    if not (install / "bin" / "postgres").is_file():
        raise RuntimeError(f"pgserver ships no PostgreSQL binaries for this platform (looked in {install})")
    return install


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _as_user() -> dict[str, Any]:
    """Popen arguments that drop root to an unprivileged user; nothing when not root."""
    if os.geteuid() != 0:
        return {}
    return {"user": RUN_AS_WHEN_ROOT, "group": "nogroup", "extra_groups": []}


def _reachable_binaries(home: Path) -> Path:
    """Debian's binaries; else pgserver's if the server's user can run them, else a copy of those under `home`."""
    debian = _debian_binaries()
    if debian is not None:
        return debian
    install = _pgserver_binaries()
    try:
        check = subprocess.run(
            [str(install / "bin" / "postgres"), "--version"], capture_output=True, check=False, **_as_user()
        )
        if check.returncode == 0:
            return install
    except PermissionError:
        pass
    # The binaries find their libraries through the wheel's relative RPATH: keep the layout.
    copy = home / "pgserver" / "pginstall"
    shutil.copytree(install, copy, symlinks=True)
    libraries = install.parent.parent / "pgserver.libs"
    if libraries.is_dir():
        shutil.copytree(libraries, home / "pgserver.libs", symlinks=True)
    return copy


def start_postgres(home: Path) -> PostgresServer:
    """initdb in `home` and start the server on a free port of 127.0.0.1 (TCP only, password auth)."""
    home.chmod(0o755)
    install = _reachable_binaries(home)
    data = home / "data"
    data.mkdir(mode=0o700)
    password = secrets.token_urlsafe(16)
    password_file = home / "password"
    password_file.write_text(password)
    if os.geteuid() == 0:
        shutil.chown(data, RUN_AS_WHEN_ROOT, "nogroup")
        shutil.chown(password_file, RUN_AS_WHEN_ROOT, "nogroup")
    initdb = subprocess.run(
        [
            str(install / "bin" / "initdb"),
            "-D", str(data),
            "-U", "postgres",
            f"--pwfile={password_file}",
            "--auth=scram-sha-256",
            "-E", "UTF8",
            "--no-sync",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=START_TIMEOUT,
        **_as_user(),
    )  # fmt: skip
    password_file.unlink()
    if initdb.returncode != 0:
        raise RuntimeError(f"initdb failed ({initdb.returncode}):\n{initdb.stdout}{initdb.stderr}")
    port = _free_port()
    log = open(home / "postgres.log", "wb")  # noqa: SIM115 - the server writes it until it stops
    process = subprocess.Popen(
        [
            str(install / "bin" / "postgres"),
            "-D", str(data),
            "-h", "127.0.0.1",
            "-p", str(port),
            "-k", "",
            "-c", "fsync=off",
            "-c", "synchronous_commit=off",
            "-c", "full_page_writes=off",
            "-c", "max_connections=30",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        **_as_user(),
    )  # fmt: skip
    log.close()
    server = PostgresServer(process, port, "postgres", password, home, install)
    _wait_until_ready(server)
    return server


def _wait_until_ready(server: PostgresServer) -> None:
    import psycopg

    deadline = time.monotonic() + START_TIMEOUT
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"PostgreSQL exited at start-up:\n{server.log[-3000:]}")
        try:
            server.connect(connect_timeout=2).close()
            return
        except psycopg.OperationalError as error:
            if time.monotonic() > deadline:
                log = server.log[-3000:]
                stop_postgres(server)
                raise RuntimeError(f"PostgreSQL did not accept connections in {START_TIMEOUT} s:\n{log}") from error
            time.sleep(0.05)


def stop_postgres(server: PostgresServer) -> None:
    """Fast shutdown (SIGINT: roll back sessions, then exit), then remove its files."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGINT)
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=15)
    shutil.rmtree(server.home, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the test session, stopped at its end."""
    # Not pytest's tmp_path: its directories are private to root, and the server may run as `nobody`.
    server = start_postgres(Path(tempfile.mkdtemp(prefix="mcp-gateway-postgres-")))
    try:
        yield server
    finally:
        stop_postgres(server)


@pytest.fixture
def postgres_database(postgres_server: PostgresServer) -> Iterator[str]:
    """A new, empty database for one test; its name. It is dropped afterwards."""
    name = f"test_{secrets.token_hex(6)}"
    with postgres_server.connect(autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with postgres_server.connect(autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
