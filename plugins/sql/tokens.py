"""Confirmation tokens: a dry run's permission to execute exactly that write, once, soon.

A token is `<nonce>.<expiry>.<signature>`, the signature an HMAC-SHA256 with a secret
made when the process starts, over the nonce, the expiry and the hash of the
statement's normalized text. Tokens live only in this process's memory: a restart
forgets them all, and a token is removed when it is used or found expired. The clock
is injectable so tests can expire a token without sleeping.

Behind a load balancer the dry run and the execution may reach different replicas:
`SharedTokenStore` keeps the issued tokens in the deployment's PostgreSQL database
(`GATEWAY_DATABASE_URL`, table `plugin_sql_tokens`) instead, each redeemed by one
`DELETE ... RETURNING`, so a token is used once whichever replica sees it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["SharedTokenStore", "TokenRefused", "TokenStore"]


class TokenRefused(ValueError):
    """The token cannot authorise this statement; the message says why and what to do."""


@dataclass(frozen=True)
class _Issued:
    digest: str
    expires: float
    summary: str


_AGAIN = "run execute_sql with dry_run=true on the statement to get a new token"


class TokenStore:
    """Issues and redeems single-use, expiring tokens bound to a statement digest."""

    def __init__(self, lifetime_s: float, clock: Callable[[], float] = time.time) -> None:
        self.lifetime_s = lifetime_s
        self.clock = clock
        self._secret = secrets.token_bytes(32)
        self._issued: dict[str, _Issued] = {}
        self._lock = threading.Lock()

    def _sign(self, nonce: str, expires: int, digest: str) -> str:
        message = f"{nonce}.{expires}.{digest}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def issue(self, digest: str, summary: str) -> tuple[str, float]:
        """A new token for the statement with this digest, and the time it expires."""
        nonce = secrets.token_urlsafe(12)
        expires = int(self.clock() + self.lifetime_s) + 1
        with self._lock:
            now = self.clock()
            for stale in [n for n, issued in self._issued.items() if issued.expires <= now]:
                del self._issued[stale]
            self._issued[nonce] = _Issued(digest, expires, summary)
        return f"{nonce}.{expires}.{self._sign(nonce, expires, digest)}", expires

    def redeem(self, token: str, digest: str) -> None:
        """Use the token for the statement with this digest, or raise `TokenRefused` saying why."""
        nonce, _, rest = token.strip().partition(".")
        expiry_text, _, signature = rest.partition(".")
        if not (nonce and expiry_text.isdigit() and signature):
            raise TokenRefused(f"confirmation_token is not a token this server issued; {_AGAIN}")
        expires = int(expiry_text)
        with self._lock:
            issued = self._issued.get(nonce)
            if issued is None or not hmac.compare_digest(signature, self._sign(nonce, expires, issued.digest)):
                raise TokenRefused(
                    "confirmation_token is unknown: it was already used, or it was never issued by this "
                    f"server (tokens are single-use and do not survive a restart); {_AGAIN}"
                )
            if self.clock() >= issued.expires:
                del self._issued[nonce]
                raise TokenRefused(
                    f"confirmation_token expired {self.clock() - issued.expires:.0f} s ago "
                    f"(tokens live {self.lifetime_s:g} s); {_AGAIN}"
                )
            if not hmac.compare_digest(issued.digest, digest):
                raise TokenRefused(
                    f"confirmation_token was issued for another statement ({issued.summary}), not this one; "
                    f"a token runs only the exact statement of its dry run; {_AGAIN}"
                )
            del self._issued[nonce]


class SharedTokenStore(TokenStore):
    """`TokenStore` with the issued tokens in a PostgreSQL database, for replicas (see the module's docstring).

    The signature is not checked against a secret (each replica has its own): the nonce is random and
    must be found in the table, bound to the statement's digest, which is as strong."""

    def __init__(self, url: str, lifetime_s: float, clock: Callable[[], float] = time.time) -> None:
        super().__init__(lifetime_s, clock)
        self.url = url
        self._ready = False

    def _connect(self) -> Any:
        import psycopg  # the gateway's own dependency; only imported when a database is configured

        connection = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
        if not self._ready:
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (0x6D637174,))  # "mcqt"
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS plugin_sql_tokens (nonce TEXT PRIMARY KEY, digest TEXT NOT NULL, "
                    "expires DOUBLE PRECISION NOT NULL, summary TEXT NOT NULL)"
                )
            self._ready = True
        return connection

    def issue(self, digest: str, summary: str) -> tuple[str, float]:
        nonce = secrets.token_urlsafe(12)
        expires = int(self.clock() + self.lifetime_s) + 1
        with self._connect() as db:
            db.execute("DELETE FROM plugin_sql_tokens WHERE expires <= %s", (self.clock(),))
            db.execute("INSERT INTO plugin_sql_tokens VALUES (%s, %s, %s, %s)", (nonce, digest, expires, summary))
        return f"{nonce}.{expires}.{self._sign(nonce, expires, digest)}", expires

    def redeem(self, token: str, digest: str) -> None:
        nonce, _, rest = token.strip().partition(".")
        expiry_text, _, signature = rest.partition(".")
        if not (nonce and expiry_text.isdigit() and signature):
            raise TokenRefused(f"confirmation_token is not a token this server issued; {_AGAIN}")
        with self._connect() as db, db.transaction():
            row = db.execute(
                "SELECT digest, expires, summary FROM plugin_sql_tokens WHERE nonce = %s FOR UPDATE", (nonce,)
            ).fetchone()
            if row is None or int(row[1]) != int(expiry_text):
                raise TokenRefused(
                    "confirmation_token is unknown: it was already used, or it was never issued by this "
                    f"server; {_AGAIN}"
                )
            issued = _Issued(str(row[0]), float(row[1]), str(row[2]))
            if self.clock() >= issued.expires:
                db.execute("DELETE FROM plugin_sql_tokens WHERE nonce = %s", (nonce,))
                raise TokenRefused(
                    f"confirmation_token expired {self.clock() - issued.expires:.0f} s ago "
                    f"(tokens live {self.lifetime_s:g} s); {_AGAIN}"
                )
            if not hmac.compare_digest(issued.digest, digest):
                raise TokenRefused(
                    f"confirmation_token was issued for another statement ({issued.summary}), not this one; "
                    f"a token runs only the exact statement of its dry run; {_AGAIN}"
                )
            db.execute("DELETE FROM plugin_sql_tokens WHERE nonce = %s", (nonce,))
