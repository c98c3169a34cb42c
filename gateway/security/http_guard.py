"""The ASGI middleware in front of every HTTP route, in the order an attacker meets it.

0. `/healthz` and `/readyz` are for load balancers: no Host check (they probe by IP
   address) and no credentials needed; `/readyz` lists the servers only to a caller
   whose credentials verify, when authentication is on. `/metrics` joins them only when
   `GATEWAY_HTTP__METRICS_PUBLIC` is true; otherwise it is guarded like `/mcp`.
1. Host and Origin headers (DNS rebinding): a foreign one gets 403.
   Then, for a gateway without `auth:` (unless told `insecure_no_auth`): a request that shows it
   came from beyond loopback (proxy headers, a remote client, a public Host; see
   `gateway.security.reachability`) gets 403 with how to add auth, on every route alike
   (`/mcp`, `/route`, `/feedback`, `/admin`, `/metrics` even when public).
2. `/.well-known/oauth-protected-resource[/<path>]`: the OAuth protected-resource
   metadata (RFC 9728), public, as the MCP authorization spec asks.
3. Authentication, when `auth:` configures keys or JWTs: no or a bad bearer token gets
   401 with `WWW-Authenticate: Bearer resource_metadata="..."`.
4. The caller's rate limit: 429 with `Retry-After` (whole seconds) and a JSON-RPC error
   body, for any request, including a `tools/call` inside a session.
5. The request body size: 413 above `security.limits.max_request_bytes`.

Under `session_prefix` (the operator console, `/admin`), a request without an `Authorization`
header goes on unauthenticated after the Host/Origin check: the console checks its own
session cookie (`gateway.serving.admin.access`). One with the header is checked as above.

The authenticated `Principal` rides in the ASGI scope (`PRINCIPAL_KEY`), where the
MCP handlers find it through `ctx.request.scope`; `scope["user"]` is set too, so the
SDK binds each streamable-HTTP session to the caller that created it.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import RequestBodyLimitMiddleware, TransportSecurityMiddleware
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config.security import AuthConfig
from gateway.security.auth import Authenticator, AuthError, Principal
from gateway.security.ratelimit import Limiter, RateLimiter
from gateway.security.reachability import FORWARDING_NAMES, request_beyond_loopback

__all__ = [
    "METADATA_PATH",
    "PRINCIPAL_KEY",
    "PUBLIC_PATHS",
    "Refusal",
    "SecurityMiddleware",
    "current_principal",
    "forwardable_token",
    "principal_in",
]

logger = logging.getLogger(__name__)

PRINCIPAL_KEY = "mcp_gateway.principal"
METADATA_PATH = "/.well-known/oauth-protected-resource"
PUBLIC_PATHS = ("/healthz", "/readyz")
"""Health probes for load balancers: no Host check, no authentication, no rate limit."""
RATE_LIMITED = -32029
"""JSON-RPC error code of a rate-limited request (implementation-defined server range)."""


_principal: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("mcp_gateway_principal", default=None)


def current_principal() -> Principal | None:
    """The caller of the HTTP request this task is handling, for code the SDK calls without the
    request (its check of a `tools/call`'s `Mcp-Param-*` headers against the tool's schema)."""
    return _principal.get()


def principal_in(request: Any) -> Principal | None:
    """The caller of an HTTP request (None: stdio, in memory, or no authentication configured)."""
    scope = getattr(request, "scope", None)
    found = scope.get(PRINCIPAL_KEY) if isinstance(scope, dict) else None
    return found if isinstance(found, Principal) else None


def forwardable_token(request: Any) -> str | None:
    """The caller's own bearer token, for servers configured with `forward_caller_token: true`.

    With authentication on, only a JWT the gateway verified is the caller's own token;
    a gateway API key is the gateway's secret and is never forwarded. With authentication
    off, whatever bearer token the client sent is its own. stdio and in-memory: None.
    """
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict) or scope.get("type") != "http":
        return None
    header = None
    for name, value in scope["headers"]:
        if name == b"authorization":  # the first
            header = value
            break
    if header is None:
        return None  # none: each call of a client without credentials, nothing decoded
    scheme, _, token = header.decode("latin-1").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    principal = scope.get(PRINCIPAL_KEY)
    if isinstance(principal, Principal) and principal.issuer is None:
        return None
    return token.strip()


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request refused before the app: a JSON answer."""

    status: int
    body: dict[str, Any]
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)

    async def send(self, send: Send) -> None:
        await _send_json(send, self.status, self.body, self.headers)


class SecurityMiddleware:
    """Host/Origin, metadata, authentication, rate limit and body size, before the app."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        guard: TransportSecurityMiddleware,
        auth: AuthConfig,
        endpoint_path: str,
        max_body: int,
        authenticator: Authenticator | None = None,
        public_paths: tuple[str, ...] = PUBLIC_PATHS,
        session_prefix: str | None = None,
        limiter: Limiter | None = None,
        loopback_only: Callable[[str], str] | None = None,
    ) -> None:
        """`public_paths`: routes served without Host check or credentials (the health probes,
        and `/metrics` when `GATEWAY_HTTP__METRICS_PUBLIC` says so); `session_prefix`: routes whose
        app authenticates a request without an `Authorization` header itself (a session cookie);
        `loopback_only`: set when the gateway may serve loopback alone (no `auth:`), the refusal
        (`reachability.no_auth_refusal`) of a request from beyond, given why it is from beyond."""
        self.app = RequestBodyLimitMiddleware(app, max_body)
        self.public_paths = public_paths
        self.guard = guard
        self.auth = auth
        self.endpoint_path = endpoint_path
        self.authenticator = authenticator
        self.limiter: Limiter = limiter if limiter is not None else RateLimiter()
        """Per caller: this process's buckets, or the deployment's (a shared database)."""
        self.session_prefix = session_prefix
        self.loopback_only = loopback_only
        self._told_loopback_only = False
        self._origins_passed: set[tuple[bytes | None, bytes | None, Any]] = set()
        """Where requests that passed the Host/Origin and loopback checks came from (`_origin_key`):
        those checks read nothing else, and what they let pass once they let pass again."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        if scope["path"] in PUBLIC_PATHS:  # the health probes: a load balancer's, from anywhere
            await self._public(request, scope, receive, send)
            return
        if scope["path"] not in self.public_paths:
            refused = await self._foreign(request)
            if refused is not None:
                await refused.send(send)
                return
        refused = self._beyond_loopback(request, scope)
        if refused is not None:
            await refused.send(send)
            return
        if scope["path"] in self.public_paths:
            await self._public(request, scope, receive, send)
            return
        if scope["path"].startswith(METADATA_PATH):
            await self._metadata(request, send)
            return
        if self.session_prefix is not None and _under(scope["path"], self.session_prefix):
            if not request.headers.get("authorization"):
                await self.app(scope, receive, send)
                return
        if self.authenticator is not None:
            refused = await self._admit(request, scope)
            if refused is not None:
                await refused.send(send)
                return
        await self.run(scope, receive, send, self.app)

    @property
    def screens_endpoint(self) -> bool:
        """Whether `screen` is this middleware's whole check of a request to the endpoint (its path
        is neither public, nor the metadata's, nor under the console's prefix)."""
        path = self.endpoint_path
        return (
            path not in PUBLIC_PATHS
            and path not in self.public_paths
            and not path.startswith(METADATA_PATH)
            and (self.session_prefix is None or not _under(path, self.session_prefix))
        )

    async def screen(self, scope: Scope) -> Refusal | None:
        """What `__call__` checks of a request to the endpoint path (when `screens_endpoint`): the
        Host/Origin check, loopback only, authentication and the rate limit, in that order; the
        caller then runs the app with `run`. For a front that skips the ASGI layers
        (`gateway.serving.hot_front`) yet must refuse exactly what this middleware refuses."""
        key = _origin_key(scope)
        if key is None or key not in self._origins_passed:
            request = Request(scope)
            refused = await self._foreign(request)
            if refused is None:
                refused = self._beyond_loopback(request, scope)
            if refused is not None:
                return refused
            if key is not None and len(self._origins_passed) < _ORIGINS_KEPT:
                self._origins_passed.add(key)
        if self.authenticator is not None:
            return await self._admit(Request(scope), scope)
        return None

    async def run(self, scope: Scope, receive: Receive, send: Send, app: ASGIApp) -> None:
        """`app` on a screened request, as the caller (`current_principal`)."""
        principal = scope.get(PRINCIPAL_KEY) if self.authenticator is not None else None
        if not isinstance(principal, Principal):
            await app(scope, receive, send)
            return
        entered = _principal.set(principal)
        try:
            await app(scope, receive, send)
        finally:
            _principal.reset(entered)

    async def _foreign(self, request: Request) -> Refusal | None:
        """403 for a Host or Origin not allowed (DNS rebinding)."""
        refused = await self.guard.validate_request(request, is_post=False)
        if refused is None:
            return None
        reason = bytes(refused.body).decode(errors="replace")
        return Refusal(403, {"error": f"{reason}: this host or origin is not allowed"})

    def _beyond_loopback(self, request: Request, scope: Scope) -> Refusal | None:
        """403 for a request from beyond loopback to a gateway that may serve loopback alone."""
        if self.loopback_only is None:
            return None
        why = request_beyond_loopback(request.headers, scope.get("client"))
        if why is None:
            return None
        level = logging.INFO if self._told_loopback_only else logging.WARNING  # one warning, then info
        self._told_loopback_only = True
        logger.log(level, "refused %s %s (no auth:): %s", request.method, scope["path"], why)
        return Refusal(403, {"error": "authentication_required", "message": self.loopback_only(why)})

    async def _admit(self, request: Request, scope: Scope) -> Refusal | None:
        """Authentication (the principal put in the scope) and the caller's rate limit."""
        try:
            principal = await self._authenticate(request)
        except AuthError as exc:
            logger.info("refused %s %s: %s", request.method, scope["path"], exc.reason)
            return self._refusal(request, exc)
        scope[PRINCIPAL_KEY] = principal
        token = AccessToken(token="-", client_id=principal.name, scopes=[], claims={"iss": principal.issuer})
        scope["user"] = AuthenticatedUser(token)
        wait = await self.limiter.admit(principal.name, principal.rate_limit)
        if not wait:
            return None
        logger.info("rate-limited %r for %d s", principal.name, wait)
        message = f"Rate limit exceeded for {principal.name!r}: retry after {wait} s."
        error = {"code": RATE_LIMITED, "message": message, "data": {"retryAfter": wait}}
        body = {"jsonrpc": "2.0", "id": None, "error": error}
        return Refusal(429, body, [(b"retry-after", str(wait).encode())])

    async def _public(self, request: Request, scope: Scope, receive: Receive, send: Send) -> None:
        """Health probes: no Host check, no credentials needed (a valid one shows the details)."""
        if self.authenticator is not None and request.headers.get("authorization"):
            with contextlib.suppress(AuthError):
                scope[PRINCIPAL_KEY] = await self._authenticate(request)
        await self.app(scope, receive, send)

    async def _authenticate(self, request: Request) -> Principal:
        assert self.authenticator is not None
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if not header:
            raise AuthError("authentication required: send Authorization: Bearer <API key or token>")
        if scheme.lower() != "bearer" or not token.strip():
            raise AuthError("the Authorization header must be `Bearer <API key or token>`")
        return await self.authenticator.authenticate(token.strip())

    def _resource(self, request: Request) -> str:
        if self.auth.resource_url:
            return self.auth.resource_url
        return f"{request.url.scheme}://{request.url.netloc}{self.endpoint_path}"

    def _metadata_url(self, request: Request) -> str:
        base = f"{request.url.scheme}://{request.url.netloc}"
        if self.auth.resource_url:
            parts = urlsplit(self.auth.resource_url)
            base = f"{parts.scheme}://{parts.netloc}"
        return f"{base}{METADATA_PATH}{self.endpoint_path}"

    async def _metadata(self, request: Request, send: Send) -> None:
        if request.method not in ("GET", "HEAD"):
            await _send_json(send, 405, {"error": "use GET"}, [(b"allow", b"GET")])
            return
        document: dict[str, Any] = {
            "resource": self._resource(request),
            "bearer_methods_supported": ["header"],
            "resource_name": "mcp-gateway",
        }
        if self.auth.jwt is not None:
            document["authorization_servers"] = [self.auth.jwt.issuer]
        await _send_json(send, 200, document)

    def _refusal(self, request: Request, error: AuthError) -> Refusal:
        parts = [f'resource_metadata="{self._metadata_url(request)}"']
        if error.status == 403:
            parts.insert(0, 'error="insufficient_scope"')
        elif request.headers.get("authorization"):
            parts.insert(0, 'error="invalid_token"')
        challenge = "Bearer " + ", ".join(parts)
        code = "insufficient_scope" if error.status == 403 else "invalid_token"
        body = {"error": code, "error_description": error.reason}
        return Refusal(error.status, body, [(b"www-authenticate", challenge.encode())])


_ORIGINS_KEPT = 1024
"""Origins (`_origin_key`) `SecurityMiddleware.screen` remembers as passed, at most: a few in practice."""


def _origin_key(scope: Scope) -> tuple[bytes | None, bytes | None, Any] | None:
    """What the Host/Origin check (`TransportSecurityMiddleware.validate_request`, which reads the
    first `Host` and `Origin`) and the loopback check (`request_beyond_loopback`: the client's address,
    the `Host`, any forwarding header) read of a request: (host, origin, client address). None for a
    request with a forwarding header: checked every time."""
    host = origin = None
    for name, value in scope["headers"]:
        if name == b"host":
            host = value if host is None else host
        elif name == b"origin":
            origin = value if origin is None else origin
        elif name in FORWARDING_NAMES:
            return None
    client = scope.get("client")
    return host, origin, next(iter(client), None) if client else None


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix.rstrip("/") + "/")


async def _send_json(
    send: Send, status: int, body: dict[str, Any], headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    payload = json.dumps(body).encode()
    start_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": start_headers + (headers or [])})
    await send({"type": "http.response.body", "body": payload})
