"""Confirmation tokens: a dry run's permission to execute exactly that write, once, soon.

A token is `<nonce>.<expiry>.<signature>`, the signature an HMAC-SHA256 with a secret
made when the process starts, over the nonce, the expiry and the hash of the
statement's normalized text. Tokens live only in this process's memory: a restart
forgets them all, and a token is removed when it is used or found expired. The clock
is injectable so tests can expire a token without sleeping.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TokenRefused", "TokenStore"]


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
