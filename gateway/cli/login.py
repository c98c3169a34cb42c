"""`mcp-gateway login SERVER` and `logout SERVER`: the gateway's own identity at a server behind OAuth.

`login` prints the authorization URL (and opens a browser when `webbrowser` finds one), catches
the callback on 127.0.0.1 (the server's `auth.callback_port`, `--port`, or a free port), and
stores the grant encrypted (`gateway.upstreams.oauth`); a running gateway waiting in
`needs_login` picks it up at its next look in the store. `logout` revokes the grant where the
server offers revocation (RFC 7009), then deletes it and the client registration.

A dynamic client registration is kept for its redirect URI, which names the callback's port. With
no port configured, `login` takes the port of its last login again when it is free (the vault's
`CALLBACK_SLOT` says which), so that logging in again reuses that registration instead of
registering a new client at the authorization server every time.
"""

from __future__ import annotations

import argparse
import sys
import webbrowser
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
import httpx2
from anyio.abc import SocketAttribute
from anyio.streams.stapled import MultiListener

from gateway.cli.common import EXIT_CONFIG, EXIT_FAILED, EXIT_OK, Usage
from gateway.config.loader import load_config
from gateway.config.settings import Settings
from gateway.server_specs import spec_from_config
from gateway.upstreams.oauth import (
    LinkFlows,
    OAuthBinding,
    OAuthFlowFailed,
    OAuthVaultError,
    UnknownLink,
    revoke,
    vault_from_settings,
)
from gateway.upstreams.oauth.grant import client_slot

__all__ = ["add_parsers", "run_login", "run_logout"]

CALLBACK_PATH = "/callback"
CALLBACK_SLOT = "login-callback"
"""The vault slot of a server's last login callback (`{"redirect_uri": ...}`), never a secret."""
MAX_REQUEST = 16 * 1024
"""Bytes of a callback request read at most (a request line and headers)."""


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    login = commands.add_parser("login", help="log the gateway in to a server with `auth: oauth`")
    login.add_argument("server", help="the server's id in the config")
    login.add_argument("--port", type=int, help="127.0.0.1 port for the callback (default: auth.callback_port or free)")
    login.add_argument("--no-browser", action="store_true", help="only print the URL")
    login.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the callback (default 600)")
    login.set_defaults(run=run_login)
    logout = commands.add_parser("logout", help="revoke and delete the gateway's tokens for a server")
    logout.add_argument("server", help="the server's id in the config")
    logout.set_defaults(run=run_logout)


def _binding(settings: Settings, server_id: str) -> tuple[OAuthBinding, bool]:
    """The OAuth binding of `server_id`, and whether it speaks SSE."""
    config = load_config(settings.config)
    server = config.servers.get(server_id)
    if server is None:
        known = ", ".join(sid for sid, s in config.servers.items() if s.auth is not None) or "none"
        raise Usage(f"no server {server_id!r} in {settings.config}; servers with `auth: oauth`: {known}")
    if server.auth is None:
        raise Usage(f"server {server_id!r} has no `auth: oauth` in {settings.config}")
    spec = spec_from_config(server, settings, vault_from_settings(settings))
    assert spec.oauth is not None
    return spec.oauth, server.transport == "sse"


def run_login(args: argparse.Namespace, settings: Settings) -> int:
    binding, sse = _binding(settings, args.server)
    port = args.port if args.port is not None else binding.config.callback_port
    try:
        return anyio.run(_login, binding, sse, port, not args.no_browser, args.timeout)
    except OAuthVaultError as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (OAuthFlowFailed, httpx2.HTTPError, TimeoutError) as exc:
        why = str(exc) or f"no callback within {args.timeout:g} s"
        print(f"mcp-gateway: login to {args.server!r} failed: {why}", file=sys.stderr)
        return EXIT_FAILED


async def _callback_listener(binding: OAuthBinding, port: int) -> MultiListener[anyio.abc.SocketStream]:
    """The callback's listener: on `port`, or (0) on the last login's port when it is free, else any."""
    if port == 0:
        last = await binding.vault.get(binding.server_id, CALLBACK_SLOT)
        last_port = urlsplit(str(last.get("redirect_uri", ""))).port if last else None
        if last_port:
            try:
                return await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=last_port)
            except OSError:  # taken now: a new port, and so a new registration
                pass
    return await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=port)


async def _login(binding: OAuthBinding, sse: bool, port: int, open_browser: bool, timeout: float) -> int:
    binding.vault.check_key()
    async with anyio.create_task_group() as tg:
        flows = LinkFlows(lambda: tg, ttl=timeout)
        listener = await _callback_listener(binding, port)
        redirect = f"http://127.0.0.1:{listener.extra(SocketAttribute.local_port)}{CALLBACK_PATH}"
        done = anyio.Event()
        outcome: list[BaseException] = []

        async def callback(stream: anyio.abc.SocketStream) -> None:
            async with stream:
                query = await _read_callback(stream)
                if query is None:
                    await _answer(stream, 404, "Not the login callback.")
                    return
                try:
                    _, _, grant = await flows.complete(
                        query.get("state", ""),
                        query.get("code"),
                        iss=query.get("iss"),
                        error=query.get("error"),
                    )
                except (UnknownLink, OAuthFlowFailed) as exc:
                    await _answer(stream, 400, f"Login failed: {exc}")
                    outcome.append(exc)
                else:
                    lasts = (
                        f" (the access token lasts {grant.lifetime:g} s, then is refreshed)" if grant.lifetime else ""
                    )
                    await _answer(stream, 200, f"Logged in to {binding.server_id}{lasts}. You can close this window.")
                done.set()

        tg.start_soon(listener.serve, callback)
        url = await flows.begin(binding, None, redirect, sse=sse)
        print(f"Open this URL to log the gateway in to {binding.server_id!r}:\n{url}", flush=True)
        if open_browser:
            _open_browser(url)
        with anyio.fail_after(timeout):
            await done.wait()
        tg.cancel_scope.cancel()
    if outcome:
        raise OAuthFlowFailed(str(outcome[0]))
    await binding.vault.put(binding.server_id, CALLBACK_SLOT, {"redirect_uri": redirect})
    print(
        f"Logged in to {binding.server_id!r}; the tokens are stored encrypted. "
        f"A running gateway picks them up within {binding.poll_interval:g} s."
    )
    return EXIT_OK


def _open_browser(url: str) -> None:
    """Open `url` where a browser is found; a machine without one just has the printed URL."""
    try:
        webbrowser.get().open(url)
    except webbrowser.Error:
        pass


async def _read_callback(stream: anyio.abc.SocketStream) -> dict[str, str] | None:
    """The query of a `GET /callback?...` request, or None for any other request."""
    data = b""
    with anyio.move_on_after(10):
        while b"\r\n\r\n" not in data and len(data) < MAX_REQUEST:
            try:
                data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                break
    method, _, rest = data.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
    target = rest.partition(" ")[0]
    parts = urlsplit(target)
    if method != "GET" or parts.path != CALLBACK_PATH:
        return None
    return {key: values[0] for key, values in parse_qs(parts.query).items()}


async def _answer(stream: anyio.abc.SocketStream, status: int, text: str) -> None:
    body = f"<!doctype html><title>mcp-gateway login</title><p>{_escape(text)}</p>\n".encode()
    reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}[status]
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/html; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
    )
    try:
        await stream.send(head.encode() + body)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass


async def _forget_registration(binding: OAuthBinding) -> None:
    """Delete the client registration of the last login's callback, and the note of that callback."""
    last = await binding.vault.get(binding.server_id, CALLBACK_SLOT)
    if last is not None and last.get("redirect_uri"):
        await binding.vault.delete(binding.server_id, client_slot(str(last["redirect_uri"])))
    await binding.vault.delete(binding.server_id, CALLBACK_SLOT)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def run_logout(args: argparse.Namespace, settings: Settings) -> int:
    binding, _ = _binding(settings, args.server)
    try:
        return anyio.run(_logout, binding)
    except OAuthVaultError as exc:
        print(f"mcp-gateway: {exc}", file=sys.stderr)
        return EXIT_CONFIG


async def _logout(binding: OAuthBinding) -> int:
    grant = await binding.grant(None)
    if grant is None:
        print(f"The gateway is not logged in to {binding.server_id!r}.")
        return EXIT_OK
    revoked = False
    try:
        async with httpx2.AsyncClient(timeout=30.0) as client:
            revoked = await revoke(grant, client)
    except httpx2.HTTPError as exc:
        print(
            f"warning: the server did not confirm the revocation ({type(exc).__name__}); deleting anyway",
            file=sys.stderr,
        )
    await binding.forget(None)
    await _forget_registration(binding)
    done = "revoked at the server and deleted" if revoked else "deleted (not revoked at the server)"
    print(f"Logged out of {binding.server_id!r}: the tokens were {done}.")
    return EXIT_OK
