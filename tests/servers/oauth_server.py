"""A real OAuth authorization server and a real MCP server that requires its tokens, for the OAuth tests.

Both run in this process on 127.0.0.1, each on its own free port; the script prints
`PORTS=<authorization server>,<MCP server>` once both listen. Built from the SDK's server-side
auth: the authorization server is `create_auth_routes` (metadata RFC 8414, dynamic registration
RFC 7591, authorize, token, revocation RFC 7009) over the in-memory provider below; the MCP
server is an `MCPServer` acting as resource server: protected-resource metadata (RFC 9728), 401
with `WWW-Authenticate: Bearer resource_metadata=...`, and only tokens issued for its own URL
(RFC 8707 `resource`) and the `mcp` scope.

Consent is automatic: `/authorize` redirects to `/consent`, which redirects at once to the
client's redirect URI with a code, for the user named by `?user=` (default `operator`), so a
test's HTTP client following redirects plays the browser. Test-only routes: `POST
/admin/revoke?user=NAME` revokes every token of a user (as a provider's "revoke access" page
would), `GET /admin/stats` counts grants and refreshes, `GET /admin/issued` lists every token and
client secret issued (for the leak test).

With `--exchange-jwks FILE --exchange-issuer ISS`, `/token` also takes RFC 8693 token exchanges:
a JWT signed by one of those keys, for the pre-registered client, becomes an access token for its
subject (refused for the user `eve`).

The MCP server's tool `whoami` answers the subject of the token its request came with.

Run: `python tests/servers/oauth_server.py [http|sse] [--token-ttl SECONDS] [--client ...]`
(`--client ID:SECRET@REDIRECT_URI`: a pre-registered confidential client).
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import anyio
import jwt
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    ProviderTokenVerifier,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.routes import create_auth_routes
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions, RevocationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from pydantic import AnyHttpUrl, AnyUrl
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

SCOPE = "mcp"


class Provider:
    """An in-memory `OAuthAuthorizationServerProvider` with automatic consent."""

    def __init__(self, issuer: str, token_ttl: int) -> None:
        self.issuer = issuer
        self.token_ttl = token_ttl
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.pending: dict[str, tuple[OAuthClientInformationFull, AuthorizationParams]] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.stats = {"registrations": 0, "codes": 0, "refreshes": 0, "revocations": 0, "exchanges": 0}
        self.issued: list[str] = []
        """Every token and client secret ever issued, for the leak test to look for."""

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.stats["registrations"] += 1
        assert client_info.client_id is not None
        if client_info.client_secret:
            self.issued.append(client_info.client_secret)
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        request_id = secrets.token_urlsafe(16)
        self.pending[request_id] = (client, params)
        return f"{self.issuer}/consent?request={request_id}"

    def consent(self, request_id: str, user: str) -> str:
        client, params = self.pending.pop(request_id)
        code = secrets.token_urlsafe(24)
        assert client.client_id is not None
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [SCOPE],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
            subject=user,
        )
        self.stats["codes"] += 1
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    def _issue(self, client_id: str, scopes: list[str], resource: str | None, subject: str | None) -> OAuthToken:
        access, refresh = "at-" + secrets.token_urlsafe(24), "rt-" + secrets.token_urlsafe(24)
        self.issued += [access, refresh]
        expires = int(time.time()) + self.token_ttl
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires, resource=resource, subject=subject
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client_id, scopes=scopes, resource=resource, subject=subject
        )
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=self.token_ttl,
            refresh_token=refresh,
            scope=" ".join(scopes),
        )

    async def exchange_authorization_code(
        self, client: OAuthClientInformationFull, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        del self.codes[authorization_code.code]
        assert client.client_id is not None
        return self._issue(
            client.client_id, authorization_code.scopes, authorization_code.resource, authorization_code.subject
        )

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: OAuthClientInformationFull, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        self.refresh.pop(refresh_token.token, None)  # rotated
        self.stats["refreshes"] += 1
        assert client.client_id is not None
        return self._issue(
            client.client_id, scopes or refresh_token.scopes, refresh_token.resource, refresh_token.subject
        )

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.stats["revocations"] += 1
        self.revoke_user(token.subject)

    def revoke_user(self, subject: str | None) -> int:
        """End every token of `subject` (its grant), as a provider's "revoke access" does."""
        gone = [t for t, v in self.access.items() if v.subject == subject]
        gone += [t for t, v in self.refresh.items() if v.subject == subject]
        for token in gone:
            self.access.pop(token, None)
            self.refresh.pop(token, None)
        return len(gone)

    async def exchange_identity_assertion(self, *args: Any, **kwargs: Any) -> OAuthToken:
        raise NotImplementedError("not offered by this test server")


TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
REFUSED_SUBJECT = "eve"
"""A user whose token the exchange refuses (as an identity provider refuses a user without access)."""


def _with_token_exchange(app: Any, provider: Provider, jwks_file: str, issuer: str) -> Any:
    """`POST /token` with the RFC 8693 grant: the caller's JWT (signed by a key of `jwks_file`, from
    `issuer`) exchanged, for a pre-registered client, for an access token of the requested `resource`.
    Other token requests go on to the SDK's handler (the body is replayed)."""
    keys = json.loads(Path(jwks_file).read_text())["keys"]
    public = {k["kid"]: jwt.algorithms.RSAAlgorithm.from_jwk(json.dumps(k)) for k in keys}

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/token" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
        if form.get("grant_type") != TOKEN_EXCHANGE:
            sent = False

            async def replay() -> dict[str, Any]:
                nonlocal sent
                if sent:
                    return {"type": "http.disconnect"}
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            await app(scope, replay, send)
            return
        response = _exchange(provider, public, issuer, form)
        await response(scope, receive, send)

    return wrapped


def _exchange(provider: Provider, public: dict[str, Any], issuer: str, form: dict[str, str]) -> Response:
    client = provider.clients.get(form.get("client_id", ""))
    if client is None or not client.client_secret or form.get("client_secret") != client.client_secret:
        return JSONResponse({"error": "invalid_client"}, status_code=401)
    if form.get("subject_token_type") != "urn:ietf:params:oauth:token-type:jwt":
        return JSONResponse({"error": "invalid_request"}, status_code=400)
    token = form.get("subject_token", "")
    try:
        kid = jwt.get_unverified_header(token)["kid"]
        claims = jwt.decode(token, public[kid], algorithms=["RS256"], issuer=issuer, options={"verify_aud": False})
    except (jwt.PyJWTError, KeyError):
        return JSONResponse({"error": "invalid_grant"}, status_code=400)
    if claims["sub"] == REFUSED_SUBJECT:
        return JSONResponse({"error": "invalid_grant", "error_description": "no access"}, status_code=400)
    provider.stats["exchanges"] += 1
    assert client.client_id is not None
    issued = provider._issue(client.client_id, [SCOPE], form.get("resource"), claims["sub"])
    payload = issued.model_dump(exclude_none=True)
    payload.pop("refresh_token", None)  # an exchanged token is exchanged again, not refreshed
    payload["issued_token_type"] = "urn:ietf:params:oauth:token-type:access_token"
    return JSONResponse(payload)


def _bound() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def build(
    transport: str,
    as_port: int,
    rs_port: int,
    token_ttl: int,
    client: str | None,
    exchange: tuple[str, str] | None = None,
) -> tuple[Any, Starlette, Provider]:
    issuer = f"http://127.0.0.1:{as_port}"
    resource = f"http://127.0.0.1:{rs_port}/{'mcp' if transport == 'http' else 'sse'}"
    provider = Provider(issuer, token_ttl)
    if client:
        pair, _, redirect_uri = client.partition("@")
        client_id, _, secret = pair.partition(":")
        provider.clients[client_id] = OAuthClientInformationFull(
            client_id=client_id,
            client_secret=secret,
            redirect_uris=[AnyUrl(redirect_uri)],
            scope=SCOPE,
            token_endpoint_auth_method="client_secret_post",
            grant_types=["authorization_code", "refresh_token"],
        )
    routes = create_auth_routes(
        provider,  # type: ignore[arg-type]
        AnyHttpUrl(issuer),
        client_registration_options=ClientRegistrationOptions(enabled=True, valid_scopes=[SCOPE]),
        revocation_options=RevocationOptions(enabled=True),
    )

    async def consent(request: Request) -> Response:
        request_id = request.query_params.get("request", "")
        if request_id not in provider.pending:
            return JSONResponse({"error": "unknown request"}, status_code=400)
        return RedirectResponse(provider.consent(request_id, request.query_params.get("user", "operator")), 302)

    async def revoke(request: Request) -> Response:
        """RFC 7009 revocation. (The SDK's handler requires a `client_secret` field even from a public
        client, which RFC 7009 does not ask of one, so this server has its own.)"""
        form = await request.form()
        client = provider.clients.get(str(form.get("client_id", "")))
        if client is None or (client.client_secret and form.get("client_secret") != client.client_secret):
            return JSONResponse({"error": "invalid_client"}, status_code=401)
        token = str(form.get("token", ""))
        found = provider.access.get(token) or provider.refresh.get(token)
        if found is not None and found.client_id == client.client_id:
            await provider.revoke_token(found)
        return Response(status_code=200, headers={"Cache-Control": "no-store"})

    async def revoke_user(request: Request) -> Response:
        return JSONResponse({"revoked": provider.revoke_user(request.query_params["user"])})

    async def stats(request: Request) -> Response:
        return JSONResponse(provider.stats)

    async def issued(request: Request) -> Response:
        return JSONResponse({"tokens": provider.issued})

    routes = [route for route in routes if getattr(route, "path", "") != "/revoke"]
    routes += [
        Route("/revoke", revoke, methods=["POST"]),
        Route("/consent", consent, methods=["GET"]),
        Route("/admin/revoke", revoke_user, methods=["POST"]),
        Route("/admin/stats", stats, methods=["GET"]),
        Route("/admin/issued", issued, methods=["GET"]),
    ]
    authorization_server: Any = Starlette(routes=routes)
    if exchange is not None:
        authorization_server = _with_token_exchange(authorization_server, provider, *exchange)

    mcp = MCPServer(
        "oauth-protected",
        token_verifier=ProviderTokenVerifier(provider),  # type: ignore[arg-type]
        auth=AuthSettings(
            issuer_url=AnyHttpUrl(issuer),
            resource_server_url=AnyHttpUrl(resource),
            required_scopes=[SCOPE],
            validate_token_resource=True,
        ),
    )

    @mcp.tool(description="The subject (user) of the OAuth token this request came with.")
    def whoami() -> str:
        token = get_access_token()
        return token.subject or "" if token is not None else "anonymous"

    resource_server = mcp.streamable_http_app() if transport == "http" else mcp.sse_app()
    return authorization_server, resource_server, provider


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("transport", choices=["http", "sse"], nargs="?", default="http")
    parser.add_argument("--token-ttl", type=int, default=3600, help="seconds an access token lives")
    parser.add_argument("--client", help="a pre-registered confidential client, ID:SECRET@REDIRECT_URI")
    parser.add_argument("--exchange-jwks", help="accept RFC 8693 exchanges of JWTs signed by these keys")
    parser.add_argument("--exchange-issuer", help="... and from this issuer")
    args = parser.parse_args()
    import uvicorn

    as_sock, rs_sock = _bound(), _bound()
    as_port, rs_port = as_sock.getsockname()[1], rs_sock.getsockname()[1]
    exchange = (args.exchange_jwks, args.exchange_issuer) if args.exchange_jwks else None
    as_app, rs_app, _ = build(args.transport, as_port, rs_port, args.token_ttl, args.client, exchange)
    servers = [
        uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1))
        for app in (as_app, rs_app)
    ]

    # SIGUSR1 stops the authorization server alone (its port then refuses connections): a provider
    # whose token endpoint is down while the MCP server is up.
    signal.signal(signal.SIGUSR1, lambda *_: setattr(servers[0], "should_exit", True))

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(servers[0].serve, [as_sock])
            tg.start_soon(servers[1].serve, [rs_sock])
            while not all(server.started for server in servers):
                await anyio.sleep(0.01)
            print(f"PORTS={as_port},{rs_port}", flush=True)

    anyio.run(serve)
    sys.exit(0)


if __name__ == "__main__":
    main()
