"""Who may use the operator console (`/admin`), browser sessions, CSRF, and the audit trail.

- An admin is a `Principal` with `admin: true`: an API key configured with `admin: true`, or
  a JWT whose `auth.jwt.admin_claim` is `true`. Without `auth:` the console is open on
  loopback only (the `local` principal), as the rest of the gateway is (`check_exposure`).
- API clients send `Authorization: Bearer <key>` (checked by `gateway.security.http_guard`,
  which lets `/admin` requests without the header through to be checked here).
- A browser logs in by pasting a key (`login`): the session is a random id in an
  HttpOnly, SameSite=Strict cookie on `/admin` (Secure over https), mapped to the principal
  until it expires (`SESSION_SECONDS`) or the user logs out: in memory (a restart ends every
  session), or with a database in the deployment's shared table (`gateway.state.sessions`), so a
  login on one replica holds on all and survives restarts. Without `auth:` there is one loopback
  session (`local_session`), opened and audited once and given to every loopback browser without
  one: any loopback caller is the admin anyway, and a session per cookie-less request let a loop
  fill the memory and bury the audit trail under "login" rows.
- CSRF: a state-changing request authenticated by the cookie must carry the session's token
  (form field `csrf` or header `X-CSRF-Token`). One with an `Authorization` header needs
  none: a browser never adds that header to a cross-site request without a CORS preflight,
  which the gateway does not answer.
- Every admin action is written to the records' `audit` table (`audit`).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.config.security import ProfileConfig, RateLimit
from gateway.records.audit import AuditRow, write_audit
from gateway.records.store import RecordsError
from gateway.security.auth import Authenticator, AuthError, Principal
from gateway.security.http_guard import principal_in
from gateway.serving.admin.switches import ToolSwitches
from gateway.state.database import SharedStateError
from gateway.state.sessions import SharedSessions, StoredSession

if TYPE_CHECKING:
    from gateway.serving.server import GatewayServer

__all__ = [
    "ADMIN_PREFIX",
    "CSRF_FIELD",
    "CSRF_HEADER",
    "LOCAL",
    "SESSION_COOKIE",
    "SESSION_SECONDS",
    "AdminConsole",
    "AdminRefused",
    "AdminSession",
    "audit",
    "check_csrf",
    "console_for",
    "console_of",
    "csrf_token",
    "has_session",
    "login",
    "logout",
    "require_admin",
    "session_cookie",
    "with_console",
]

logger = logging.getLogger(__name__)

ADMIN_PREFIX = "/admin"
SESSION_COOKIE = "mcp_gateway_admin"
SESSION_SECONDS = 8 * 3600
"""How long a browser session lasts from its login."""
MAX_UNKNOWN = 10_000
"""Unknown session ids a console remembers, so that made-up cookies do not each cost a database read."""
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_CONSOLE_KEY = "mcp_gateway.admin_console"
_SESSION_KEY = "mcp_gateway.admin_session"

LOCAL = Principal("local", None, RateLimit(per_minute=600, burst=60), admin=True)
"""The console's user when no authentication is configured (served on loopback only)."""


class AdminRefused(Exception):
    """The console refuses this request; `status` (401, 403) and `message` say why, for the user."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class AdminSession:
    id: str
    principal: Principal
    csrf: str
    expires: float


@dataclass
class AdminConsole:
    """The console's state for one gateway: its sessions, the key checker, the tool switches."""

    gateway: GatewayServer
    sessions: dict[str, AdminSession] = field(default_factory=dict)
    authenticator: Authenticator | None = None
    switches: ToolSwitches | None = None
    local_session: str | None = None
    """Without authentication: the id of the one loopback session (`login`)."""

    shared: SharedSessions | None = None
    """The deployment's sessions (a database is configured), else None: this process's only."""
    unknown: set[str] = field(default_factory=set)
    """Cookie values the shared table did not have (random ids cannot be made later), at most `MAX_UNKNOWN`."""

    def __post_init__(self) -> None:
        if self.gateway.auth.enabled:
            self.authenticator = Authenticator(self.gateway.auth)
        shared = self.gateway.shared
        self.switches = ToolSwitches(self.gateway.registry, shared.switches if shared is not None else None)
        self.shared = shared.sessions if shared is not None else None

    def session(self, session_id: str | None) -> AdminSession | None:
        if not session_id:
            return None
        found = self.sessions.get(session_id)
        if found is None and self.shared is not None:
            found = self._shared_session(session_id)
        if found is None:
            return None
        if found.expires <= time.time():
            del self.sessions[session_id]
            return None
        return found

    def open_session(self, principal: Principal) -> AdminSession:
        now = time.time()
        for stale in [k for k, s in self.sessions.items() if s.expires <= now]:
            del self.sessions[stale]
        session = AdminSession(secrets.token_urlsafe(32), principal, secrets.token_urlsafe(32), now + SESSION_SECONDS)
        self.sessions[session.id] = session
        if self.shared is not None:
            stored = StoredSession(_principal_json(principal), session.csrf, session.expires)
            try:
                self.shared.save(session.id, stored)
            except SharedStateError as exc:
                logger.warning("console: this session holds on this replica only: %s", exc)
        return session

    def _shared_session(self, session_id: str) -> AdminSession | None:
        """A session another replica opened (one indexed read), cached here until it ends."""
        assert self.shared is not None
        if session_id in self.unknown:  # a made-up or ended id, seen moments ago: no database read for it
            return None
        try:
            stored = self.shared.load(session_id)
        except SharedStateError as exc:
            logger.warning("console: could not look a session up: %s", exc)
            return None
        if stored is None:
            if len(self.unknown) >= MAX_UNKNOWN:
                self.unknown.clear()
            self.unknown.add(session_id)
            return None
        session = AdminSession(session_id, _principal_from(stored.principal), stored.csrf, stored.expires)
        self.sessions[session_id] = session
        return session

    async def forget_ended(self) -> None:
        """Drop cached sessions another replica ended (a logout notification)."""
        if self.shared is None or not self.sessions:
            return
        live = await anyio.to_thread.run_sync(self.shared.live, list(self.sessions))
        for ended in set(self.sessions) - live:
            self.sessions.pop(ended, None)


def _principal_json(principal: Principal) -> str:
    return json.dumps(
        {
            "name": principal.name,
            "profile": principal.profile.model_dump() if principal.profile is not None else None,
            "rate_limit": principal.rate_limit.model_dump(),
            "issuer": principal.issuer,
            "admin": principal.admin,
        }
    )


def _principal_from(text: str) -> Principal:
    data = json.loads(text)
    profile = ProfileConfig.model_validate(data["profile"]) if data["profile"] is not None else None
    return Principal(
        data["name"], profile, RateLimit.model_validate(data["rate_limit"]), data["issuer"], admin=data["admin"]
    )


_consoles: weakref.WeakKeyDictionary[Any, AdminConsole] = weakref.WeakKeyDictionary()


def console_for(gateway: GatewayServer) -> AdminConsole:
    """The console of a gateway, made on first use (it installs the tool switches in its registry)."""
    console = _consoles.get(gateway)
    if console is None:
        console = _consoles[gateway] = AdminConsole(gateway)
    return console


def with_console(app: ASGIApp, gateway: GatewayServer) -> ASGIApp:
    """The HTTP app, with the console findable from every `/admin` request (`console_of`)."""
    console = console_for(gateway)

    async def served(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(ADMIN_PREFIX):
            scope[_CONSOLE_KEY] = console
        await app(scope, receive, send)

    return served


def console_of(request: Request) -> AdminConsole:
    console = request.scope.get(_CONSOLE_KEY)
    if not isinstance(console, AdminConsole):
        raise RuntimeError("this request did not come through the admin console's app (`with_console`)")
    return console


def _on_loopback(request: Request) -> bool:
    client = request.client.host if request.client is not None else None
    return client is None or client in _LOOPBACK


def _open_console(request: Request, console: AdminConsole) -> None:
    """Without authentication the console serves loopback only (as `serve` binds without auth)."""
    host = console.gateway.settings.http.host
    if host not in _LOOPBACK or not _on_loopback(request):
        raise AdminRefused(
            403,
            "The console needs authentication when the gateway is reachable beyond loopback: configure an API key "
            "with `admin: true` under auth.api_keys (see docs/console.md).",
        )


def require_admin(request: Request) -> Principal:
    """The admin making this request, or `AdminRefused`: 401 without credentials (log in), 403 for a
    principal that is not an admin."""
    console = console_of(request)
    principal = principal_in(request)  # a bearer token the HTTP guard verified
    if principal is None:
        session = console.session(request.cookies.get(SESSION_COOKIE))
        if session is not None:
            request.scope[_SESSION_KEY] = session
            principal = session.principal
    if principal is None:
        if console.authenticator is None:
            _open_console(request, console)
            return LOCAL
        raise AdminRefused(401, "Log in with an admin API key (or send Authorization: Bearer <admin key>).")
    if not principal.admin:
        raise AdminRefused(
            403,
            f"{principal.name!r} is not an admin: the console needs an API key with `admin: true` "
            "(or a token whose admin claim is true).",
        )
    return principal


async def login(request: Request, key: str) -> tuple[Principal, str]:
    """Check a pasted key and open a browser session; returns the admin and the session id.

    A key that does not verify is 401, a valid key that is not an admin's 403. Without
    authentication configured, any login on loopback opens a session for `local`."""
    console = console_of(request)
    key = (key or "").strip()
    if console.authenticator is None:
        _open_console(request, console)
        shared = console.session(console.local_session)
        if shared is not None:  # the one loopback session: given again, not opened (nor audited) again
            request.scope[_SESSION_KEY] = shared
            return LOCAL, shared.id
        principal = LOCAL
    else:
        if not key:
            raise AdminRefused(401, "Paste an admin API key to log in.")
        try:
            principal = await console.authenticator.authenticate(key)
        except AuthError as exc:
            logger.info("admin login refused: %s", exc.reason)
            raise AdminRefused(401, f"That key was refused: {exc.reason}.") from None
        if not principal.admin:
            await audit(console.gateway, principal, "login", None, "refused: not an admin")
            raise AdminRefused(
                403,
                f"The key {principal.name!r} is valid but not an admin key: set `admin: true` on it in auth.api_keys.",
            )
    session = console.open_session(principal)
    if principal is LOCAL:
        console.local_session = session.id
    request.scope[_SESSION_KEY] = session
    await audit(console.gateway, principal, "login", None, "ok")
    return principal, session.id


def session_cookie(response: Response, session_id: str, request: Request) -> None:
    """Set the session cookie: HttpOnly, SameSite=Strict, Path=/admin, Secure over https, until the
    session expires (the shared loopback session may be hours old)."""
    session = console_of(request).sessions.get(session_id)
    left = SESSION_SECONDS if session is None else max(int(session.expires - time.time()), 1)
    response.set_cookie(
        SESSION_COOKIE,
        session_id,
        max_age=left,
        path=ADMIN_PREFIX,
        secure=request.url.scheme == "https",
        httponly=True,
        samesite="strict",
    )


async def logout(request: Request, response: Response) -> None:
    """End the request's browser session (if any) and clear its cookie."""
    console = console_of(request)
    session = console.session(request.cookies.get(SESSION_COOKIE))
    if session is not None:
        console.sessions.pop(session.id, None)
        if console.shared is not None:
            await anyio.to_thread.run_sync(console.shared.delete, session.id)
        await audit(console.gateway, session.principal, "logout", None, "ok")
    response.delete_cookie(
        SESSION_COOKIE, path=ADMIN_PREFIX, secure=request.url.scheme == "https", httponly=True, samesite="strict"
    )


def has_session(request: Request) -> bool:
    """Whether the request carries a live browser session (a stale cookie is none)."""
    return _session(request) is not None


def _session(request: Request) -> AdminSession | None:
    found = request.scope.get(_SESSION_KEY)
    if isinstance(found, AdminSession):
        return found
    return console_of(request).session(request.cookies.get(SESSION_COOKIE))


def csrf_token(request: Request) -> str:
    """The CSRF token of the request's browser session, for forms (`AdminRefused` 401 without one)."""
    session = _session(request)
    if session is None:
        raise AdminRefused(401, "No console session: log in first.")
    return session.csrf


def check_csrf(request: Request, form_value: str | None) -> None:
    """Refuse (403) a state-changing request that is not an API call and lacks its session's CSRF token."""
    if request.method in SAFE_METHODS:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return  # an API call: not something a cross-site page can make a browser send
    presented = form_value or request.headers.get(CSRF_HEADER)
    session = _session(request)
    if session is None:
        raise AdminRefused(
            403, "This request changes state and needs a CSRF token from a console session; log in again."
        )
    if not presented or not hmac.compare_digest(presented.encode(), session.csrf.encode()):
        raise AdminRefused(
            403,
            "The CSRF token is missing or wrong: send the session's token in the `csrf` form field or the "
            "X-CSRF-Token header (reload the page to get it).",
        )


async def audit(
    gateway: GatewayServer,
    principal: Principal,
    action: str,
    target: str | None,
    outcome: str,
    details: dict[str, Any] | None = None,
) -> None:
    """Record an admin action (who, what, target, when, outcome) in the records' audit table, and log it.

    Without records (`GATEWAY_RECORDS__ENABLED=false`) the log line is the only trace; a store
    that fails is logged, never the action's failure."""
    row = AuditRow(principal.name, action, target, outcome, details or {})
    logger.info("admin %s: %s %s -> %s", principal.name, action, target or "-", outcome)
    records = gateway.records
    if records is None:
        return
    try:
        await anyio.to_thread.run_sync(write_audit, records.store, row)
    except RecordsError as exc:
        logger.warning("admin audit: could not record %s by %s: %s", action, principal.name, exc)
