"""The operator console's web pages at `/admin`: server-rendered with Jinja2, plain forms and links.

Every page renders the dicts of `gateway.serving.admin.views` (the JSON API returns the same), and
every form posts to a route here that calls the same actions. A page works with JavaScript off; with
it on, HTMX swaps a filter's or the playground's results in place and `console.js` runs the live tail
(`gateway.serving.admin.tail`). Who may see a page is `access.require_admin`; every POST carries the
session's CSRF token (`access.check_csrf`), and every action is audited (`access.audit`).

"Try a tool" runs a tool through the registry's call chain with the admin as caller, exactly as a
client's `tools/call` goes: validated, recorded, traced; its result can be rated from the page.
"""

from __future__ import annotations

import functools
import json
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import mcp_types as types
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.calls.chain import Caller
from gateway.errors import GatewayError
from gateway.records.feedback import FeedbackError, parse_feedback, submit_feedback
from gateway.records.model import EXECUTION_ID_NOTE
from gateway.records.recorder import CLIENT_NOTE
from gateway.security.auth import Principal
from gateway.serving.admin import access, views
from gateway.serving.admin.charts import bars, sparkline
from gateway.serving.admin.forms import RAW_FIELD, FormErrors, form_for, parse_form, posted_values
from gateway.serving.admin.tail import CallTail, tail_endpoint

if TYPE_CHECKING:
    from starlette.templating import Jinja2Templates

    from gateway.serving.server import GatewayServer

__all__ = ["FAVICON_PATH", "PREFIX", "close_console", "console_tail", "ui_routes"]

logger = logging.getLogger(__name__)

PREFIX = access.ADMIN_PREFIX
HERE = Path(__file__).parent
NAV = (
    ("", "Overview"),
    ("/tools", "Tools"),
    ("/try", "Try a tool"),
    ("/calls", "Calls"),
    ("/feedback", "Feedback"),
    ("/config", "Config"),
    ("/audit", "Audit"),
)

TRANSPORT_LABELS = {"memory": "in-process", "http": "streamable HTTP", "sse": "HTTP+SSE", "stdio": "stdio"}
"""How the console names a server's transport: a plugin runs in the gateway's process ("memory" read like
a memory figure)."""


@functools.cache
def templates() -> Jinja2Templates:
    """The console's Jinja2 templates, made on the first page: Jinja2 is imported only then (~2 MB that an
    idle gateway nobody opens the console of does not keep)."""
    from markupsafe import Markup
    from starlette.templating import Jinja2Templates

    made = Jinja2Templates(directory=HERE / "templates")
    made.env.globals.update(
        sparkline=lambda values, **kw: Markup(sparkline(values, **kw)),
        bars=lambda values, **kw: Markup(bars(values, **kw)),
        prefix=PREFIX,
        nav=NAV,
    )
    made.env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False, default=str)
    made.env.filters["transport"] = lambda value: TRANSPORT_LABELS.get(str(value), str(value))
    made.env.filters["q"] = lambda value: quote(str(value), safe="")
    made.env.filters["when"] = lambda at: (
        time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(float(at))) if isinstance(at, int | float) else ""
    )
    return made


Handler = Callable[[Request, Principal], Awaitable[Response]]

MAX_FLASHES = 1000
_flashes: dict[str, tuple[str, str]] = {}
"""One line for a session's next page (`_back`): session id -> (message, kind)."""
_tails: weakref.WeakKeyDictionary[Any, CallTail] = weakref.WeakKeyDictionary()


def console_tail(gateway: GatewayServer) -> CallTail:
    """The live tail of a gateway, attached to its records' recorder on first use."""
    tail = _tails.get(gateway)
    if tail is None:
        tail = _tails[gateway] = CallTail()
        if gateway.records is not None:
            tail.attach(gateway.records)
    return tail


def close_console(gateway: GatewayServer) -> None:
    """End the open live tails of a gateway that stops serving HTTP (they would hold up its shutdown)."""
    tail = _tails.get(gateway)
    if tail is not None:
        tail.close()


def _render(request: Request, principal: Principal | None, name: str, status: int = 200, **context: Any) -> Response:
    csrf = ""
    if principal is not None:
        try:
            csrf = access.csrf_token(request)
        except access.AdminRefused:
            csrf = ""  # a bearer-token caller has no browser session: it reads pages, posts through the API
    context.setdefault("title", "Console")
    flash, kind = _flashes.pop(request.cookies.get(access.SESSION_COOKIE) or "", ("", "ok"))
    context.setdefault("flash", flash)
    context.setdefault("flash_kind", kind)
    context.setdefault("replica", access.console_of(request).gateway.settings.replica_id)
    return templates().TemplateResponse(
        request, name, {"principal": principal, "csrf": csrf, **context}, status_code=status
    )


def _refused(request: Request, refused: access.AdminRefused) -> Response:
    if refused.status == 401:
        next_path = request.url.path if request.method == "GET" else PREFIX
        return _render(request, None, "login.html", 401, title="Log in", message=refused.message, next_path=next_path)
    return _render(request, None, "refused.html", refused.status, title="Refused", message=refused.message)


def _page(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A GET page for an admin only: others get the login page (401) or the refusal (403)."""

    async def endpoint(request: Request) -> Response:
        try:
            principal = access.require_admin(request)
        except access.AdminRefused as refused:
            return _refused(request, refused)
        if principal is access.LOCAL and not access.has_session(request):
            # No authentication (loopback only): the browser gets the loopback session at once, for its CSRF token.
            _, session_id = await access.login(request, "")
            response = await handler(request, principal)
            access.session_cookie(response, session_id, request)
            return response
        return await handler(request, principal)

    return endpoint


def _action(
    handler: Callable[[Request, Principal, FormData], Awaitable[Response]],
) -> Callable[[Request], Awaitable[Response]]:
    """A form POST: an admin, with the session's CSRF token, else refused before anything happens."""

    async def endpoint(request: Request) -> Response:
        form = await request.form()
        try:
            principal = access.require_admin(request)
            token = form.get(access.CSRF_FIELD)
            access.check_csrf(request, token if isinstance(token, str) else None)
        except access.AdminRefused as refused:
            return _refused(request, refused)
        return await handler(request, principal, form)

    return endpoint


def _back(request: Request, path: str, message: str, kind: str = "ok") -> RedirectResponse:
    """Post/redirect/get: back to a page, which then says what happened in one line. The line is kept
    for the browser's session, server-side: a link cannot make the console show a text of its own."""
    session = request.cookies.get(access.SESSION_COOKIE)
    if session:
        while len(_flashes) >= MAX_FLASHES:
            _flashes.pop(next(iter(_flashes)))
        _flashes[session] = (message, kind)
    return RedirectResponse(f"{PREFIX}{path}", status_code=303)


def _text(form: FormData, name: str) -> str:
    value = form.get(name)
    return value if isinstance(value, str) else ""


STATIC = {
    "console.css": "text/css",
    "console.js": "text/javascript",
    "htmx.min.js": "text/javascript",
    "htmx.LICENSE": "text/plain",
    "favicon.svg": "image/svg+xml",
}
"""The files under static/ that are served (a fixed list: no path from a request reaches the disk)."""


async def _static(request: Request) -> Response:
    """The console's stylesheet and scripts: public (the login page needs them), cached for an hour."""
    name = request.path_params["name"]
    media = STATIC.get(name)
    if media is None:
        return PlainTextResponse(f"No console file {name!r}.", status_code=404)
    return FileResponse(HERE / "static" / name, media_type=media, headers={"Cache-Control": "max-age=3600"})


FAVICON_PATH = "/favicon.ico"
"""Where browsers look for a site's icon when a page names none: served (the console's SVG), not a 404."""


async def _favicon(request: Request) -> Response:
    return FileResponse(
        HERE / "static" / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
    )


def ui_routes(gateway: GatewayServer) -> list[Route]:
    """The console's pages, form posts, live tail and static files, for the HTTP app to mount."""
    tail = console_tail(gateway)
    pages = _Pages(gateway, tail)
    return [
        Route(PREFIX, _page(pages.overview), methods=["GET"]),
        Route(PREFIX + "/", _page(pages.overview), methods=["GET"]),
        Route(PREFIX + "/login", pages.login_page, methods=["GET"]),
        Route(PREFIX + "/login", pages.login, methods=["POST"]),
        Route(PREFIX + "/logout", _action(pages.logout), methods=["POST"]),
        Route(PREFIX + "/servers/{server_id}", _page(pages.server), methods=["GET"]),
        Route(PREFIX + "/servers/{server_id}/{verb}", _action(pages.server_action), methods=["POST"]),
        Route(PREFIX + "/tools", _page(pages.tools), methods=["GET"]),
        Route(PREFIX + "/tools/{name}/{verb}", _action(pages.tool_action), methods=["POST"]),
        Route(PREFIX + "/try", _page(pages.try_page), methods=["GET"]),
        Route(PREFIX + "/try/{name}", _action(pages.run_tool), methods=["POST"]),
        Route(PREFIX + "/rate/{execution_id}", _action(pages.rate), methods=["POST"]),
        Route(PREFIX + "/calls", _page(pages.calls), methods=["GET"]),
        Route(PREFIX + "/calls/stream", _page(pages.stream), methods=["GET"]),
        Route(PREFIX + "/calls/{execution_id}", _page(pages.call), methods=["GET"]),
        Route(PREFIX + "/feedback", _page(pages.feedback), methods=["GET"]),
        Route(PREFIX + "/config", _page(pages.config), methods=["GET"]),
        Route(PREFIX + "/audit", _page(pages.audit), methods=["GET"]),
        Route(PREFIX + "/reload", _action(pages.reload), methods=["POST"]),
        Route(PREFIX + "/static/{name}", _static, methods=["GET"]),
        Route(FAVICON_PATH, _favicon, methods=["GET"]),
    ]


class _Pages:
    """The handlers, bound to one gateway."""

    def __init__(self, gateway: GatewayServer, tail: CallTail) -> None:
        self.gateway = gateway
        self.tail = tail

    # ---- session ------------------------------------------------------------------------

    async def login_page(self, request: Request) -> Response:
        next_path = request.query_params.get("next", PREFIX)
        return _render(request, None, "login.html", title="Log in", message="", next_path=next_path)

    async def login(self, request: Request) -> Response:
        form = await request.form()
        try:
            _, session_id = await access.login(request, _text(form, "key"))
        except access.AdminRefused as refused:
            return _render(
                request,
                None,
                "login.html",
                refused.status,
                title="Log in",
                message=refused.message,
                next_path=_text(form, "next") or PREFIX,
            )
        next_path = _text(form, "next")
        target = next_path if next_path.startswith(PREFIX) and "//" not in next_path else PREFIX
        response = RedirectResponse(target, status_code=303)
        access.session_cookie(response, session_id, request)
        return response

    async def logout(self, request: Request, principal: Principal, form: FormData) -> Response:
        response = RedirectResponse(PREFIX + "/login", status_code=303)
        await access.logout(request, response)
        return response

    # ---- servers --------------------------------------------------------------------------

    async def overview(self, request: Request, principal: Principal) -> Response:
        data = await views.overview(self.gateway)
        reloads = _reloads(self.gateway)
        return _render(request, principal, "overview.html", title="Overview", active="", data=data, reloads=reloads)

    async def server(self, request: Request, principal: Principal) -> Response:
        server_id = request.path_params["server_id"]
        try:
            data = await views.server(self.gateway, server_id)
        except views.ViewError as exc:
            return _render(request, principal, "refused.html", exc.status, title="Not found", message=exc.message)
        return _render(request, principal, "server.html", title=f"Server {server_id}", active="", data=data)

    async def server_action(self, request: Request, principal: Principal, form: FormData) -> Response:
        server_id, verb = request.path_params["server_id"], request.path_params["verb"]
        back = f"/servers/{quote(server_id, safe='')}"
        try:
            if verb == "restart":
                await views.restart_server(self.gateway, server_id, by=principal)
            elif verb in ("disable", "enable"):
                await views.set_server_enabled(self.gateway, server_id, verb == "enable", by=principal)
            else:
                return _back(request, back, f"Unknown action {verb!r}: restart, disable or enable.", "error")
        except views.ViewError as exc:
            return _back(request, back, exc.message, "error")
        return _back(request, back, f"{server_id}: {verb} done.")

    async def reload(self, request: Request, principal: Principal, form: FormData) -> Response:
        try:
            report = await views.reload(self.gateway, by=principal)
        except views.ViewError as exc:
            return _back(request, "", f"Reload refused: {exc.message}", "error")
        parts = [f"{key}: {', '.join(report[key])}" for key in ("added", "removed", "changed") if report.get(key)]
        return _back(request, "", "Reloaded. " + ("; ".join(parts) if parts else "Nothing changed."))

    # ---- tools ----------------------------------------------------------------------------

    async def tools(self, request: Request, principal: Principal) -> Response:
        query = request.query_params
        q, server, state = query.get("q", ""), query.get("server", ""), query.get("state", "")
        search, k_text = query.get("search", ""), query.get("k", "8")
        error, ranked = "", None
        try:
            rows = await views.tools(self.gateway, query=q or None, server=server or None, state=state or None)
        except views.ViewError as exc:
            rows, error = [], exc.message
        if search.strip():
            try:
                k = int(k_text) if k_text.strip().isdigit() else 0
                ranked = await views.playground(self.gateway, search, k)
            except views.ViewError as exc:
                error = exc.message
            except GatewayError as exc:
                error = exc.message
        approvals = await views.pending_approvals(self.gateway)
        servers = list(self.gateway.registry.upstreams)
        return _render(
            request, principal, "tools.html", title="Tools", active="/tools", rows=rows, approvals=approvals,
            ranked=ranked, error=error, servers=servers, states=views.TOOL_STATES,
            q=q, server=server, state=state, search=search, k=k_text,
        )  # fmt: skip

    async def tool_action(self, request: Request, principal: Principal, form: FormData) -> Response:
        name, verb = request.path_params["name"], request.path_params["verb"]
        try:
            if verb == "approve":
                done = await views.approve_tool(self.gateway, name, by=principal)
                message = (
                    f"Approved {', '.join(done['approved'])}; callable now: {', '.join(done['callable']) or 'none'}."
                )
            elif verb in ("disable", "enable"):
                await views.set_tool_enabled(self.gateway, name, verb == "enable", by=principal)
                message = f"{name}: {verb}d."
            else:
                return _back(request, "/tools", f"Unknown action {verb!r}: approve, disable or enable.", "error")
        except views.ViewError as exc:
            return _back(request, "/tools", exc.message, "error")
        return _back(request, "/tools", message)

    # ---- try a tool ------------------------------------------------------------------------

    def _cards(self) -> list[dict[str, Any]]:
        """Servers with their tools and each tool's form, for the "Try a tool" page."""
        registry = self.gateway.registry
        cards = []
        for server_id, upstream in list(registry.upstreams.items()):
            entries = [(n, e) for n, e in registry.catalog.tools.items() if e.server_id == server_id]
            tools = [
                {"name": n, "description": e.item.description or "", "form": form_for(e.item.input_schema)}
                for n, e in sorted(entries)
            ]
            cards.append({"server": server_id, "state": upstream.state, "reason": upstream.reason, "tools": tools})
        return cards

    async def try_page(self, request: Request, principal: Principal) -> Response:
        return _render(
            request, principal, "try.html", title="Try a tool", active="/try", cards=self._cards(),
            open_tool=request.query_params.get("tool", ""), run=None, values={}, errors={},
        )  # fmt: skip

    async def run_tool(self, request: Request, principal: Principal, form: FormData) -> Response:
        """Run a tool from its form, through the call chain with the admin as caller; show the result."""
        name = request.path_params["name"]
        entry = self.gateway.registry.catalog.tools.get(name)
        posted = {k: v for k, v in form.items() if isinstance(v, str)}
        if entry is None:
            run = {"tool": name, "error": f"There is no tool {name!r} in the catalog now (its server may be down)."}
            return self._try_result(request, principal, name, run, posted, {}, 404)
        tool_form = form_for(entry.item.input_schema)
        values = posted_values(tool_form, posted)
        try:
            arguments = parse_form(tool_form, posted)
        except FormErrors as exc:
            run = {"tool": name, "error": "Some parameters are wrong; nothing was run.", "retry": True}
            return self._try_result(request, principal, name, run, values, exc.errors, 400)
        run = await self._run(principal, name, arguments)
        return self._try_result(request, principal, name, run, values, {})

    async def _run(self, principal: Principal, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        notes: dict[str, Any] = {CLIENT_NOTE: principal.name}
        run: dict[str, Any] = {"tool": name, "arguments": arguments}
        try:
            result = await self.gateway.registry.call_tool(
                name, arguments, notes=notes, caller=Caller(principal=principal)
            )
        except GatewayError as exc:
            run.update(error=exc.message, code=exc.code, retry=True)
        else:
            run.update(_shown(result))
            if result.is_error:
                run["retry"] = True
        run["execution_id"] = notes.get(EXECUTION_ID_NOTE)
        outcome = "error" if run.get("error") or run.get("is_error") else "ok"
        await access.audit(self.gateway, principal, "run_tool", name, outcome, {"execution_id": run["execution_id"]})
        return run

    def _try_result(
        self,
        request: Request,
        principal: Principal,
        name: str,
        run: dict[str, Any],
        values: dict[str, str],
        errors: dict[str, str],
        status: int = 200,
    ) -> Response:
        return _render(
            request, principal, "try.html", status, title=f"Try {name}", active="/try", cards=self._cards(),
            open_tool=name, run=run, values=values, errors=errors, raw_field=RAW_FIELD,
        )  # fmt: skip

    async def rate(self, request: Request, principal: Principal, form: FormData) -> Response:
        """Feedback on a run from "Try a tool", through the records' feedback path."""
        execution_id = request.path_params["execution_id"]
        fields: dict[str, Any] = {"token": execution_id}
        if _text(form, "rating"):
            fields["rating"] = _text(form, "rating")
        if _text(form, "score"):
            fields["score"] = int(_text(form, "score")) if _text(form, "score").isdigit() else _text(form, "score")
        if _text(form, "comment").strip():
            fields["comment"] = _text(form, "comment").strip()
        records = self.gateway.records
        try:
            if records is None:
                raise FeedbackError("This gateway keeps no records (GATEWAY_RECORDS__ENABLED=false).", 404)
            done = await submit_feedback(
                records, parse_feedback(fields), may_see=lambda execution: True, client_id=principal.name
            )
        except FeedbackError as exc:
            await access.audit(self.gateway, principal, "feedback", execution_id, f"refused: {exc.message}")
            return _back(request, f"/calls/{execution_id}", f"Feedback not recorded: {exc.message}", "error")
        await access.audit(self.gateway, principal, "feedback", execution_id, "ok")
        return _back(request, f"/calls/{execution_id}", f"Feedback recorded for {done.tool}. Thank you.")

    # ---- calls and the rest --------------------------------------------------------------------

    async def calls(self, request: Request, principal: Principal) -> Response:
        query = request.query_params
        data: dict[str, Any]
        filters = {key: query.get(key, "") for key in ("server", "tool", "status")}
        error, data = "", {"calls": [], "next_before": None}
        before = query.get("before", "")
        try:
            data = await views.calls(
                self.gateway,
                server=filters["server"] or None,
                tool=filters["tool"] or None,
                status=filters["status"] or None,
                before=float(before) if before else None,
                limit=50,
            )
        except (views.ViewError, ValueError) as exc:
            error = exc.message if isinstance(exc, views.ViewError) else f"`before` must be a time in seconds: {exc}"
        last_seq = self.tail.recent[-1].seq if self.tail.recent else 0
        return _render(
            request, principal, "calls.html", title="Calls", active="/calls", data=data, filters=filters,
            error=error, servers=list(self.gateway.registry.upstreams), last_seq=last_seq,
        )  # fmt: skip

    async def stream(self, request: Request, principal: Principal) -> Response:
        return await tail_endpoint(self.tail, request)

    async def call(self, request: Request, principal: Principal) -> Response:
        execution_id = request.path_params["execution_id"]
        try:
            data = await views.call(self.gateway, execution_id)
        except views.ViewError as exc:
            return _render(request, principal, "refused.html", exc.status, title="Not found", message=exc.message)
        return _render(request, principal, "call.html", title="Call", active="/calls", data=data)

    async def feedback(self, request: Request, principal: Principal) -> Response:
        try:
            rows, error = await views.feedback(self.gateway, 100), ""
        except views.ViewError as exc:
            rows, error = [], exc.message
        return _render(
            request, principal, "feedback.html", title="Feedback", active="/feedback", rows=rows, error=error,
            learning=self.gateway.settings.learning,
        )  # fmt: skip

    async def config(self, request: Request, principal: Principal) -> Response:
        data = views.effective_config(self.gateway)
        return _render(request, principal, "config.html", title="Config", active="/config", data=data)

    async def audit(self, request: Request, principal: Principal) -> Response:
        try:
            rows, error = await views.audit(self.gateway, 200), ""
        except views.ViewError as exc:
            rows, error = [], exc.message
        return _render(request, principal, "audit.html", title="Audit", active="/audit", rows=rows, error=error)


def _reloads(gateway: GatewayServer, last: int = 5) -> list[dict[str, Any]]:
    """The latest config reloads, newest first (`Reloader.history`), so an edit refused while serving
    is seen with its message; none on a gateway without live reload."""
    reloader = gateway.reloader
    if reloader is None:
        return []
    return [report.as_dict() for report in reversed(list(reloader.history)[-last:])]


def _shown(result: types.CallToolResult) -> dict[str, Any]:
    """A tool result as the page shows it: its text blocks, other blocks by kind, and its structured content."""
    blocks = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            text = block.text
            try:
                parsed = json.loads(text)
            except ValueError:
                blocks.append({"kind": "text", "text": text})
            else:
                blocks.append({"kind": "json", "text": json.dumps(parsed, indent=2, ensure_ascii=False)})
        else:
            blocks.append({"kind": block.type, "text": f"[{block.type}]"})
    structured = result.structured_content
    return {
        "is_error": bool(result.is_error),
        "blocks": blocks,
        "structured": json.dumps(structured, indent=2, ensure_ascii=False) if structured is not None else None,
    }
