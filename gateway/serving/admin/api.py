"""The admin API: JSON under `/admin/api/v1/`, from one route table (`ROUTES`).

Each route names its method, path, parameters and the view it answers with
(`gateway.serving.admin.views`); the Starlette routes and the OpenAPI document
(`gateway.serving.admin.openapi`, served at `/admin/api/v1/openapi.json`) are both made from
the table, so they cannot disagree. Every route needs an admin (`access.require_admin`); a
state-changing one also passes `access.check_csrf`. Errors are JSON:
`{"error": <code>, "message": <what is wrong>}`, with 400 for a bad parameter (named),
401/403 from access, 404 naming the unknown server, tool or call, 501 for what this
gateway cannot do.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.records.queries import CALL_STATUSES, MAX_CALLS
from gateway.records.stats import parse_since
from gateway.security.auth import Principal
from gateway.serving.admin import views
from gateway.serving.admin.access import (
    CSRF_FIELD,
    AdminRefused,
    check_csrf,
    console_of,
    csrf_token,
    login,
    logout,
    require_admin,
    session_cookie,
)
from gateway.serving.admin.openapi import ApiRoute, Param, openapi_document
from gateway.serving.admin.views import ViewError

__all__ = ["API_PREFIX", "ROUTES", "api_routes"]

logger = logging.getLogger(__name__)

API_PREFIX = "/admin/api/v1"


class BadParameter(Exception):
    pass


def _parse(param: Param, raw: str | None) -> Any:
    if raw is None or raw == "":
        return param.default
    if param.name in ("since", "before"):
        try:
            return float(raw) if param.name == "before" else parse_since(raw, time.time())
        except ValueError as exc:
            message = str(exc) if param.name == "since" else f"`before` must be Unix seconds; got {raw!r}"
            raise BadParameter(message) from None
    if param.type == "integer":
        try:
            value: Any = int(raw)
        except ValueError:
            raise BadParameter(f"`{param.name}` must be an integer; got {raw!r}") from None
        if (param.minimum is not None and value < param.minimum) or (
            param.maximum is not None and value > param.maximum
        ):
            raise BadParameter(f"`{param.name}` must be from {param.minimum} to {param.maximum}; got {value}")
        return value
    if param.enum is not None and raw not in param.enum:
        raise BadParameter(f"`{param.name}` must be one of {', '.join(param.enum)}; got {raw!r}")
    return raw


def _gateway(request: Request) -> Any:
    return console_of(request).gateway


def _error(status: int, error: str, message: str) -> JSONResponse:
    return JSONResponse({"error": error, "message": message}, status_code=status)


# ---- answers ---------------------------------------------------------------------------


async def _login(request: Request, principal: Principal, args: dict[str, Any]) -> Response:
    key = ""
    if request.headers.get("content-type", "").startswith("application/json"):
        body = await request.json()
        key = str(body.get("key", "")) if isinstance(body, dict) else ""
    else:
        key = str((await request.form()).get("key", ""))
    admin, session_id = await login(request, key)
    response = JSONResponse({"principal": admin.name, "csrf": csrf_token(request)})
    session_cookie(response, session_id, request)
    return response


async def _logout(request: Request, principal: Principal, args: dict[str, Any]) -> Response:
    response = JSONResponse({"logged_out": True})
    await logout(request, response)
    return response


async def _servers(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return {"servers": await views.servers(_gateway(request))}


async def _server(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.server(_gateway(request), args["id"])


async def _restart(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.restart_server(_gateway(request), args["id"], by=principal)


async def _disable(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.set_server_enabled(_gateway(request), args["id"], False, by=principal)


async def _enable(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.set_server_enabled(_gateway(request), args["id"], True, by=principal)


async def _tools(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    found = await views.tools(_gateway(request), query=args["q"], server=args["server"], state=args["state"])
    return {"tools": found}


async def _approvals(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return {"approvals": await views.pending_approvals(_gateway(request))}


async def _approve(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.approve_tool(_gateway(request), args["name"], by=principal)


async def _tool_disable(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.set_tool_enabled(_gateway(request), args["name"], False, by=principal)


async def _tool_enable(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.set_tool_enabled(_gateway(request), args["name"], True, by=principal)


async def _calls(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.calls(
        _gateway(request),
        server=args["server"],
        tool=args["tool"],
        status=args["status"],
        since=args["since"],
        limit=args["limit"],
        before=args["before"],
    )


async def _call(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.call(_gateway(request), args["id"])


async def _search(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    if args["q"] is None:
        raise BadParameter("`q` is required: the request to rank tools for")
    return await views.playground(_gateway(request), args["q"], args["k"])


async def _feedback(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return {"feedback": await views.feedback(_gateway(request), args["limit"])}


async def _config(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return views.effective_config(_gateway(request))


async def _audit(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return {"audit": await views.audit(_gateway(request), args["limit"])}


async def _reload(request: Request, principal: Principal, args: dict[str, Any]) -> Any:
    return await views.reload(_gateway(request), by=principal)


def _limit(default: int) -> Param:
    return Param("limit", "query", "integer", "How many, newest first.", minimum=1, maximum=MAX_CALLS, default=default)


_SERVER_ID = Param("id", "path", description="The server id.")
_TOOL_NAME = Param("name", "path", description="The exposed tool name (`prefix__tool`) or `server/tool`.")

ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute(
        "POST",
        "/login",
        "Log in with an admin key (form or JSON field `key`): sets the session cookie.",
        _login,
        auth=False,
    ),
    ApiRoute("POST", "/logout", "End the browser session.", _logout),
    ApiRoute("GET", "/servers", "Every server: state, reason, breaker, tools, recent figures.", _servers),
    ApiRoute(
        "GET", "/servers/{id}", "One server with its tools, recent calls and stderr tail.", _server, (_SERVER_ID,)
    ),
    ApiRoute("POST", "/servers/{id}/restart", "Restart one server; the others keep serving.", _restart, (_SERVER_ID,)),
    ApiRoute("POST", "/servers/{id}/disable", "Stop one server and keep it stopped.", _disable, (_SERVER_ID,)),
    ApiRoute("POST", "/servers/{id}/enable", "Start a disabled server.", _enable, (_SERVER_ID,)),
    ApiRoute(
        "GET",
        "/tools",
        "Every tool with its state (enabled, disabled, withheld) and approval.",
        _tools,
        (
            Param("q", "query", description="Words that must all appear in the name or description."),
            Param("server", "query", description="Only this server's tools."),
            Param("state", "query", enum=views.TOOL_STATES, description="Only tools in this state."),
        ),
    ),
    ApiRoute("GET", "/approvals", "Changed or flagged tools, with diffs of description and schema.", _approvals),
    ApiRoute(
        "POST", "/tools/{name}/approve", "Trust a tool's current definition; callable at once.", _approve, (_TOOL_NAME,)
    ),
    ApiRoute(
        "POST",
        "/tools/{name}/disable",
        "Hide a tool from every list and refuse its calls.",
        _tool_disable,
        (_TOOL_NAME,),
    ),
    ApiRoute("POST", "/tools/{name}/enable", "Serve a disabled tool again.", _tool_enable, (_TOOL_NAME,)),
    ApiRoute(
        "GET",
        "/calls",
        "Recent calls, newest first; `next_before` pages on.",
        _calls,
        (
            Param("server", "query", description="Only calls to this server."),
            Param("tool", "query", description="Only calls of this exposed tool name."),
            Param("status", "query", enum=CALL_STATUSES, description="ok, error, timeout or refused."),
            Param("since", "query", description="A duration back from now (10m, 24h) or an ISO date or time."),
            Param(
                "before",
                "query",
                "number",
                "Only calls before this time (Unix seconds): the last page's `next_before`.",
            ),
            _limit(100),
        ),
    ),
    ApiRoute(
        "GET",
        "/calls/{id}",
        "One call: arguments (redacted), result summary, failures, feedback.",
        _call,
        (Param("id", "path", description="The execution id."),),
    ),
    ApiRoute(
        "GET",
        "/search",
        "The router's ranking for a request, with each tool's score parts (lexical, dense, learned).",
        _search,
        (
            Param("q", "query", description="The request, in plain words (required)."),
            Param("k", "query", "integer", "How many tools.", minimum=1, maximum=50, default=8),
        ),
    ),
    ApiRoute("GET", "/feedback", "The latest feedback on calls.", _feedback, (_limit(100),)),
    ApiRoute("GET", "/config", "The effective config and settings, every secret masked.", _config),
    ApiRoute("GET", "/audit", "The latest admin actions: who, what, target, when, outcome.", _audit, (_limit(100),)),
    ApiRoute("POST", "/reload", "Reload the config file now and apply the per-server changes.", _reload),
)


def _endpoint(route: ApiRoute) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            principal = require_admin(request) if route.auth else None
            if route.auth and route.changes_state:
                form = None
                if request.headers.get("content-type", "").startswith(
                    ("application/x-www-form-urlencoded", "multipart/form-data")
                ):
                    value = (await request.form()).get(CSRF_FIELD)
                    form = value if isinstance(value, str) else None
                check_csrf(request, form)
            args = {
                p.name: _parse(
                    p, request.path_params.get(p.name) if p.where == "path" else request.query_params.get(p.name)
                )
                for p in route.params
            }
            answer = await route.answer(request, principal, args)  # type: ignore[arg-type]
        except AdminRefused as exc:
            return _error(exc.status, "unauthorized" if exc.status == 401 else "forbidden", exc.message)
        except BadParameter as exc:
            return _error(400, "bad_request", str(exc))
        except ViewError as exc:
            return _error(exc.status, exc.error, exc.message)
        if isinstance(answer, Response):
            return answer
        return JSONResponse(answer)

    return endpoint


def api_routes() -> list[Route]:
    """The API's Starlette routes, and `GET openapi.json`, to mount in the HTTP app (`gateway.serving.http`)."""

    async def document(request: Request) -> Response:
        try:
            require_admin(request)
        except AdminRefused as exc:
            return _error(exc.status, "unauthorized" if exc.status == 401 else "forbidden", exc.message)
        return JSONResponse(openapi_document(ROUTES, API_PREFIX))

    routes = [Route(API_PREFIX + r.path, _endpoint(r), methods=[r.method]) for r in ROUTES]
    routes.append(Route(API_PREFIX + "/openapi.json", document, methods=["GET"]))
    return routes
