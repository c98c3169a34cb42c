"""Who is calling: API keys (stored as sha256 hashes) and JWTs checked against a JWKS.

Keys are hashed with plain SHA-256, not a slow KDF, on purpose: `keys new` makes
256-bit random keys, which no amount of hashing speed makes guessable, and a slow
KDF would cost milliseconds on every request. Presented keys are hashed and compared
with every stored hash in constant time (`hmac.compare_digest`), so neither timing
nor the position of a key in the list says anything.

A JWT (three dot-separated parts) is verified with PyJWT: signature against the
configured JWKS (a file, or a URL fetched and cached by `PyJWKClient`), `iss`, `aud`,
`exp`, and `nbf`. Its profile comes from a claim (`auth.jwt.profile_claim`), and whether it may use
the operator console from another (`auth.jwt.admin_claim`, which must be `true`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio

from gateway.config.security import HASH_PREFIX, AuthConfig, JwtConfig, ProfileConfig, RateLimit

if TYPE_CHECKING:
    import jwt

__all__ = ["Authenticator", "AuthError", "Principal", "hash_key", "new_key"]

logger = logging.getLogger(__name__)

KEY_PREFIX = "mgw_"
MIN_KEY_LENGTH = 24


def new_key() -> str:
    """A fresh API key: 256 random bits, URL-safe, with a prefix that secret scanners can spot."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """The form stored in the config: `sha256:<hex>`."""
    return HASH_PREFIX + hashlib.sha256(key.encode("utf-8")).hexdigest()


class AuthError(Exception):
    """A presented credential was refused; `reason` is safe to show (it never contains the credential)."""

    def __init__(self, reason: str, *, status: int = 401) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: a key's name or a JWT subject, with what it may see and how fast."""

    name: str
    profile: ProfileConfig | None
    """None: every server and tool."""
    rate_limit: RateLimit
    issuer: str | None = None
    admin: bool = False
    """May use the operator console and the admin API: an API key with `admin: true`, or a JWT whose
    `auth.jwt.admin_claim` is true."""


class Authenticator:
    """Turns a bearer token into a `Principal`, or raises `AuthError`."""

    def __init__(self, config: AuthConfig) -> None:
        self.config = config
        self._keys = [(bytes.fromhex(k.hash.removeprefix(HASH_PREFIX)), k) for k in config.api_keys]
        self._jwt = _JwtVerifier(config.jwt) if config.jwt is not None else None

    async def authenticate(self, token: str) -> Principal:
        if self._jwt is not None and token.count(".") == 2:
            claims = await self._jwt.verify(token)
            return self._jwt_principal(claims)
        digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        found = None
        for stored, key in self._keys:  # no early exit: every hash is compared
            if hmac.compare_digest(stored, digest):
                found = key
        if found is None:
            raise AuthError("invalid API key")
        profile = self.config.profiles.get(found.profile) if found.profile else None
        return Principal(found.name, profile, self._rate(found.rate_limit, profile), admin=found.admin)

    def _jwt_principal(self, claims: dict[str, Any]) -> Principal:
        assert self.config.jwt is not None
        jwt_config = self.config.jwt
        wanted = claims.get(jwt_config.profile_claim, jwt_config.default_profile)
        if wanted is None:
            claim = jwt_config.profile_claim
            raise AuthError(f"the token has no {claim!r} claim and there is no default profile", status=403)
        if not isinstance(wanted, str) or wanted not in self.config.profiles:
            raise AuthError("the token's profile is not one this gateway knows", status=403)
        profile = self.config.profiles[wanted]
        subject = str(claims.get("sub") or claims.get("client_id") or "?")
        admin = claims.get(jwt_config.admin_claim) is True  # a boolean claim; "true" as a string is not enough
        rate = self._rate(None, profile)
        return Principal(f"jwt:{subject}", profile, rate, issuer=str(claims.get("iss")), admin=admin)

    def _rate(self, own: RateLimit | None, profile: ProfileConfig | None) -> RateLimit:
        return own or (profile.rate_limit if profile is not None else None) or self.config.rate_limit


class _JwtVerifier:
    def __init__(self, config: JwtConfig) -> None:
        # PyJWT (and its algorithms) is imported only when `auth.jwt` is configured: ~2 MB an idle
        # gateway without it does not keep. The JWKS file is still read here, at start.
        import jwt

        self.config = config
        self._client: jwt.PyJWKClient | None = None
        self._keys: jwt.PyJWKSet | None = None
        if config.jwks_url is not None:
            self._client = jwt.PyJWKClient(config.jwks_url, cache_keys=True, lifespan=300, timeout=10)
        else:
            assert config.jwks_file is not None
            self._keys = _read_jwks(config.jwks_file)

    async def verify(self, token: str) -> dict[str, Any]:
        import jwt  # imported by __init__ already: a dictionary look-up

        try:
            key = await self._signing_key(token)
            claims: dict[str, Any] = jwt.decode(
                token,
                key.key,
                algorithms=list(self.config.algorithms),
                audience=self.config.audience,
                issuer=self.config.issuer,
                leeway=self.config.leeway,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWKClientConnectionError:
            logger.warning("cannot fetch the JWKS from %s", self.config.jwks_url)
            raise AuthError("the token's signing keys cannot be fetched right now") from None
        except jwt.PyJWTError as exc:
            raise AuthError(f"invalid token: {exc}") from None
        return claims

    async def _signing_key(self, token: str) -> jwt.PyJWK:
        import jwt  # imported by __init__ already

        if self._client is not None:
            client = self._client
            return await anyio.to_thread.run_sync(client.get_signing_key_from_jwt, token)
        assert self._keys is not None
        kid = jwt.get_unverified_header(token).get("kid")
        candidates = [k for k in self._keys.keys if kid is None or k.key_id == kid]
        if not candidates:
            raise jwt.InvalidTokenError(f"no key with kid {kid!r} in the JWKS")
        return candidates[0]


def _read_jwks(path: Any) -> jwt.PyJWKSet:
    """Read a JWKS file; a problem is a ValueError naming the file."""
    import jwt  # imported by _JwtVerifier already

    try:
        return jwt.PyJWKSet.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, jwt.PyJWTError) as exc:
        raise ValueError(f"cannot read the JWKS file {path}: {exc}") from None
