"""OAuth tokens and client registrations at rest, encrypted: in the data dir, or in PostgreSQL for replicas.

Every record is a JSON object encrypted with Fernet (AES-128-CBC with HMAC-SHA256, from
`cryptography`) under the key from `GATEWAY_OAUTH__KEY` or `GATEWAY_OAUTH__KEY_FILE`. Without a
key nothing is read or written: `OAuthKeyMissing` says how to make one. A record is named by
its server and a *slot*: `gateway` for the gateway's own identity, `user:<hash>` for a caller's
linked account, `client:<hash>` for a dynamic client registration; names are hashes, so neither
the file names nor the table's keys say who linked what.

Files: `<data_dir>/oauth/<server>/<slot>.fernet`, written to a temporary file and renamed, mode
0600. PostgreSQL (`database_url` set): the table `oauth_vault`, one row per record, so every
replica sees a token another replica refreshed or a user linked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio.to_thread
from cryptography.fernet import Fernet, InvalidToken

from gateway.config.settings import Settings
from gateway.urls import redact_url

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "KEY_HINT",
    "FileBackend",
    "OAuthKeyMissing",
    "OAuthVaultError",
    "PostgresBackend",
    "Vault",
    "vault_from_settings",
]

logger = logging.getLogger(__name__)

KEY_HINT = (
    "set GATEWAY_OAUTH__KEY (or GATEWAY_OAUTH__KEY_FILE, a file holding it) to a key made with "
    '`python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"` '
    "and keep it: tokens stored under one key cannot be read with another"
)
TABLE = "oauth_vault"
_SCHEMA_LOCK = 0x6D67_776F_6175  # "mgwoau": serializes CREATE TABLE among replicas starting together
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    server TEXT NOT NULL,
    slot TEXT NOT NULL,
    sealed BYTEA NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (server, slot)
)
"""


class OAuthVaultError(Exception):
    """The token store cannot be used (no key, a wrong key, an unreachable database)."""


class OAuthKeyMissing(OAuthVaultError):
    """No encryption key is configured, so no token may be stored or read."""


class Backend(Protocol):
    """Where sealed records live."""

    def read(self, server: str, slot: str) -> bytes | None: ...

    def write(self, server: str, slot: str, sealed: bytes) -> None: ...

    def delete(self, server: str, slot: str) -> bool: ...


class FileBackend:
    """One file per record under `root` (the data dir's `oauth/`), readable by the owner only."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, server: str, slot: str) -> Path:
        return self.root / server / f"{slot.replace(':', '-')}.fernet"

    def read(self, server: str, slot: str) -> bytes | None:
        try:
            return self._path(server, slot).read_bytes()
        except FileNotFoundError:
            return None

    def write(self, server: str, slot: str, sealed: bytes) -> None:
        path = self._path(server, slot)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = path.with_suffix(".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(sealed)
        partial.replace(path)

    def delete(self, server: str, slot: str) -> bool:
        try:
            self._path(server, slot).unlink()
        except FileNotFoundError:
            return False
        return True


class PostgresBackend:
    """One row per record in `oauth_vault`, shared by the replicas; a short connection per use."""

    def __init__(self, url: str, *, connect_timeout: float = 5.0) -> None:
        self.url = url
        self._connect_timeout = max(1, round(connect_timeout))
        self._ready = False

    @contextlib.contextmanager
    def _connect(self) -> Iterator[psycopg.Connection[Any]]:
        import psycopg  # only with a PostgreSQL store: ~10 MB an idle gateway without one does not hold

        try:
            with psycopg.connect(
                self.url, connect_timeout=self._connect_timeout, application_name="mcp-gateway"
            ) as connection:
                if not self._ready:
                    with connection.transaction():
                        connection.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                        connection.execute(_SCHEMA)
                    self._ready = True
                yield connection
        except psycopg.Error as error:
            detail = redact_url(str(error).strip().splitlines()[0]) if str(error).strip() else type(error).__name__
            raise OAuthVaultError(f"the OAuth token store at {redact_url(self.url)} failed: {detail}") from None

    def read(self, server: str, slot: str) -> bytes | None:
        with self._connect() as connection:
            row = connection.execute(
                f"SELECT sealed FROM {TABLE} WHERE server = %s AND slot = %s", (server, slot)
            ).fetchone()
        return bytes(row[0]) if row else None

    def write(self, server: str, slot: str, sealed: bytes) -> None:
        with self._connect() as connection:
            connection.execute(
                f"INSERT INTO {TABLE} (server, slot, sealed) VALUES (%s, %s, %s) "
                "ON CONFLICT (server, slot) DO UPDATE SET sealed = EXCLUDED.sealed, updated_at = now()",
                (server, slot, sealed),
            )

    def delete(self, server: str, slot: str) -> bool:
        with self._connect() as connection:
            cursor = connection.execute(f"DELETE FROM {TABLE} WHERE server = %s AND slot = %s", (server, slot))
            return cursor.rowcount > 0


class Vault:
    """Encrypted JSON records by (server, slot). The key is read at first use, so a gateway without
    one still starts: only the OAuth servers then say why they cannot connect."""

    def __init__(self, backend: Backend, key: str | None = None, key_file: Path | None = None) -> None:
        self.backend = backend
        self._key = key
        self._key_file = key_file
        self._fernet: Fernet | None = None

    def _cipher(self) -> Fernet:
        if self._fernet is None:
            key = self._key
            if not key and self._key_file is not None:
                try:
                    key = self._key_file.read_text(encoding="utf-8").strip()
                except OSError as exc:
                    raise OAuthKeyMissing(
                        f"cannot read the OAuth key file {self._key_file}: {exc.strerror}; {KEY_HINT}"
                    ) from None
            if not key:
                raise OAuthKeyMissing(f"OAuth tokens are stored encrypted and no key is configured: {KEY_HINT}")
            try:
                self._fernet = Fernet(key.encode())
            except ValueError:
                raise OAuthKeyMissing(
                    f"the OAuth key is not a Fernet key (urlsafe base64 of 32 bytes); {KEY_HINT}"
                ) from None
        return self._fernet

    def check_key(self) -> None:
        """Raise `OAuthKeyMissing` now if no usable key is configured."""
        self._cipher()

    async def get(self, server: str, slot: str) -> dict[str, Any] | None:
        cipher = self._cipher()
        sealed = await anyio.to_thread.run_sync(self.backend.read, server, slot)
        if sealed is None:
            return None
        try:
            return dict(json.loads(cipher.decrypt(sealed)))
        except InvalidToken:
            raise OAuthVaultError(
                f"a stored OAuth record of server {server!r} cannot be decrypted with the configured key "
                "(was the key changed?); log in again, or restore the key it was stored under"
            ) from None

    async def put(self, server: str, slot: str, record: dict[str, Any]) -> None:
        sealed = self._cipher().encrypt(json.dumps(record, separators=(",", ":")).encode())
        await anyio.to_thread.run_sync(self.backend.write, server, slot, sealed)

    async def delete(self, server: str, slot: str) -> bool:
        return await anyio.to_thread.run_sync(self.backend.delete, server, slot)


def vault_from_settings(settings: Settings) -> Vault:
    """The vault a gateway with these settings uses: PostgreSQL when `database_url` is set, else the data dir."""
    backend: Backend
    if settings.database_url:
        backend = PostgresBackend(settings.database_url)
    else:
        backend = FileBackend(settings.data_dir / "oauth")
    key = settings.oauth.key.get_secret_value() if settings.oauth.key is not None else None
    return Vault(backend, key, settings.oauth.key_file)
