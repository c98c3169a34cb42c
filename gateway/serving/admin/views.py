"""The console's data: plain JSON-able dicts and lists over a running `GatewayServer`.

The admin API (`gateway.serving.admin.api`) answers with them as they are and the web pages
render the same dicts, so the two never disagree. Reads of the records go to a worker
thread (`gateway.records.queries`: indexed, bounded). Actions (`restart_server`,
`set_server_enabled`, `approve_tool`, `set_tool_enabled`, `reload`) take the admin who acts
(`by`) and are audited (`gateway.serving.admin.access.audit`) whatever their outcome.
A `ViewError` carries the HTTP status and a message that names what is wrong.
"""

from __future__ import annotations

import difflib
import json
import os
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio

from gateway.config.servers import MASK
from gateway.records.audit import audit_rows
from gateway.records.queries import CallFilter, ServerWindow, call_detail, call_rows, feedback_rows, window
from gateway.records.store import RecordsError
from gateway.router.explain import explain
from gateway.security.auth import Principal
from gateway.serving.admin.access import audit as audit_action
from gateway.serving.admin.access import console_for
from gateway.urls import redact_url
from gateway.version import installed_version

if TYPE_CHECKING:
    from gateway.records.store import RecordStore
    from gateway.serving.server import GatewayServer

__all__ = [
    "SERIES_MINUTES",
    "WINDOW_SECONDS",
    "ViewError",
    "approve_tool",
    "audit",
    "call",
    "calls",
    "effective_config",
    "feedback",
    "overview",
    "pending_approvals",
    "playground",
    "reload",
    "restart_server",
    "server",
    "servers",
    "set_server_enabled",
    "set_tool_enabled",
    "tools",
]

SERIES_MINUTES = 15
"""The overview's recent window, in whole minutes (the current one included): its calls/min, error rate
and p50, and the points of the per-minute sparkline series."""
WINDOW_SECONDS = SERIES_MINUTES * 60
TOOL_STATES = ("enabled", "disabled", "withheld")
_SECRET_NAME = ("key", "token", "secret", "passw", "auth", "cookie", "credential")
_NOT_SECRET = ("redact_keys",)
"""Setting names that look secret and are not (the list of key patterns records redact)."""


class ViewError(Exception):
    """What the console cannot do: `status` (HTTP), `error` (a short code) and `message` (for people)."""

    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error = error
        self.message = message


def _not_found(kind: str, name: str, known: Sequence[str]) -> ViewError:
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return ViewError(404, "not_found", f"There is no {kind} {name!r}.{hint}")


def _store(gateway: GatewayServer) -> RecordStore:
    if gateway.records is None:
        raise ViewError(
            409, "records_off", "This gateway keeps no records (GATEWAY_RECORDS__ENABLED=false): no call log."
        )
    return gateway.records.store


async def _read(gateway: GatewayServer, read: Callable[[RecordStore], Any], *, flush: bool = False) -> Any:
    """Run a read of the records in a worker thread (after writing what is buffered, when `flush`)."""
    store = _store(gateway)
    try:
        if flush and gateway.records is not None and gateway.records.writer.pending:
            await gateway.records.flush()
        return await anyio.to_thread.run_sync(read, store)
    except RecordsError as exc:
        raise ViewError(503, "records_unavailable", str(exc)) from None


# ---- servers ---------------------------------------------------------------------------


def _figures(found: ServerWindow | None) -> dict[str, Any]:
    """calls/min, error rate and p50 over the window, and per-minute series of calls and p50 (oldest first)."""
    if found is None:
        found = ServerWindow(0, 0, [0] * SERIES_MINUTES, [[] for _ in range(SERIES_MINUTES)])
    calls, errors = found.calls, found.errors
    latencies = [value for minute in found.latencies for value in minute]
    return {
        "calls": calls,
        "calls_per_minute": round(calls / SERIES_MINUTES, 2),
        "error_rate": round(errors / calls, 4) if calls else None,
        "caller_error_rate": round(found.caller_errors / calls, 4) if calls else None,
        "p50_ms": round(statistics.median(latencies), 2) if latencies else None,
        "series": {
            "calls": found.per_minute,
            "p50_ms": [round(statistics.median(b), 2) if b else None for b in found.latencies],
        },
    }


async def _window(gateway: GatewayServer, now: float) -> dict[str, ServerWindow] | None:
    if gateway.records is None:
        return None
    first_minute = (now // 60 - SERIES_MINUTES + 1) * 60
    found: dict[str, ServerWindow] = await _read(
        gateway, lambda store: window(store, first_minute, SERIES_MINUTES), flush=True
    )
    return found


def _server_row(gateway: GatewayServer, server_id: str, windows: dict[str, ServerWindow] | None) -> dict[str, Any]:
    upstream = gateway.registry.upstreams[server_id]
    row = gateway.registry.server_health(upstream)
    row.update(
        name=upstream.spec.display_name,
        description=upstream.spec.description,
        transport=upstream.spec.transport,
        origin=upstream.spec.origin,
        enabled=upstream.spec.enabled,
        pid=upstream.pid,
    )
    row["figures"] = _figures(windows.get(server_id)) if windows is not None else None
    return row


async def servers(gateway: GatewayServer) -> list[dict[str, Any]]:
    """Every server: state, reason, breaker, tools, calls in flight, and its recent figures (None without records)."""
    now = time.time()
    windows = await _window(gateway, now)
    return [_server_row(gateway, server_id, windows) for server_id in list(gateway.registry.upstreams)]


async def overview(gateway: GatewayServer) -> dict[str, Any]:
    """The gateway at a glance: version, transport, exposure mode, router state, and every server's row."""
    router = gateway.router
    figures = router.figures() if router is not None else None
    return {
        "version": installed_version() or "unknown",
        "transport": "http",  # the console is served over HTTP only
        "stateless": gateway.stateless,
        "mode": gateway.settings.routing.mode,
        "auth": gateway.auth.enabled,
        "records": gateway.records is not None,
        "router": {
            "ready": bool(router is not None and router.ready.is_set()),
            "complete": bool(router is not None and router.complete.is_set()),
            "semantic": figures.semantic if figures is not None else False,
            "tools": len(router.router) if router is not None and router.router is not None else 0,
        },
        "last_reload": gateway.reloader.last.as_dict() if gateway.reloader and gateway.reloader.last else None,
        "window_seconds": WINDOW_SECONDS,
        "servers": await servers(gateway),
    }


async def server(gateway: GatewayServer, server_id: str) -> dict[str, Any]:
    """One server: its row, its tools, its recent calls and its stderr tail."""
    upstreams = gateway.registry.upstreams
    if server_id not in upstreams:
        raise _not_found("server", server_id, list(upstreams))
    now = time.time()
    windows = await _window(gateway, now)
    row = _server_row(gateway, server_id, windows)
    row["stderr"] = gateway.registry.server_health(upstreams[server_id], stderr=True).get("stderr", [])
    row["tools_list"] = await tools(gateway, server=server_id)
    recent = None
    if gateway.records is not None:
        recent = await _read(gateway, lambda store: call_rows(store, CallFilter(server=server_id, limit=20)))
    row["recent_calls"] = recent
    return row


async def restart_server(gateway: GatewayServer, server_id: str, *, by: Principal) -> dict[str, Any]:
    """Restart one server's connection (and process); the others keep serving."""
    if server_id not in gateway.registry.upstreams:
        raise _not_found("server", server_id, list(gateway.registry.upstreams))
    await _audited(gateway, by, "restart", server_id, gateway.registry.restart_server, server_id)
    return {"server": server_id, "restarted": True}


async def set_server_enabled(gateway: GatewayServer, server_id: str, enabled: bool, *, by: Principal) -> dict[str, Any]:
    """Disable (stop, and keep stopped) or enable (start) one server."""
    if server_id not in gateway.registry.upstreams:
        raise _not_found("server", server_id, list(gateway.registry.upstreams))

    async def action(server_id: str, enabled: bool) -> None:
        await gateway.registry.set_server_enabled(server_id, enabled)
        if gateway.shared is not None:  # every replica follows (`gateway.serving.replication`)
            await anyio.to_thread.run_sync(gateway.shared.switches.set_enabled, "servers", server_id, enabled, by.name)

    await _audited(gateway, by, "enable" if enabled else "disable", server_id, action, server_id, enabled)
    return {"server": server_id, "enabled": enabled}


async def _audited(
    gateway: GatewayServer,
    by: Principal,
    action: str,
    target: str | None,
    run: Callable[..., Awaitable[Any]],
    *args: Any,
) -> Any:
    """Run an action and audit it with its outcome (a failure is audited, then raised)."""
    try:
        result = await run(*args)
    except ViewError as exc:
        await audit_action(gateway, by, action, target, f"refused: {exc.message}")
        raise
    except ValueError as exc:  # e.g. restarting a disabled server: the message says what to do instead
        await audit_action(gateway, by, action, target, f"refused: {exc}")
        raise ViewError(409, "conflict", str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - boundary: the failure is audited, then answered
        await audit_action(gateway, by, action, target, f"failed: {type(exc).__name__}: {exc}")
        raise ViewError(500, "action_failed", f"{action} {target or ''} failed: {exc}") from exc
    await audit_action(gateway, by, action, target, "ok")
    return result


# ---- tools -----------------------------------------------------------------------------


async def tools(
    gateway: GatewayServer, *, query: str | None = None, server: str | None = None, state: str | None = None
) -> list[dict[str, Any]]:
    """Every tool: in the catalog (`enabled`), disabled by an operator (`disabled`), or withheld by vetting
    (`withheld`, with why). `query` matches the name and description (case-insensitive words)."""
    if state is not None and state not in TOOL_STATES:
        raise ViewError(400, "bad_request", f"state must be one of {', '.join(TOOL_STATES)}; got {state!r}")
    if server is not None and server not in gateway.registry.upstreams:
        raise _not_found("server", server, list(gateway.registry.upstreams))
    switches = console_for(gateway).switches
    rows: list[dict[str, Any]] = []
    reports = gateway.vetter.reports if gateway.vetter is not None else {}
    for name, entry in gateway.registry.catalog.tools.items():
        report = reports.get(name)
        rows.append(
            {
                "name": name,
                "server": entry.server_id,
                "original": entry.original,
                "description": entry.item.description or "",
                "state": "enabled",
                "approval": _approval(report),
                "findings": report.lines() if report is not None else [],
                "input_schema": entry.item.input_schema,
            }
        )
    if switches is not None:
        for name, server_id in switches.hidden.items():
            rows.append(_offline_row(gateway, name, server_id, "disabled", reports.get(name)))
    for name, report in reports.items():
        if report.action == "withheld":
            rows.append(_offline_row(gateway, name, report.server, "withheld", report))
    words = (query or "").lower().split()
    return sorted(
        (
            r
            for r in rows
            if (server is None or r["server"] == server)
            and (state is None or r["state"] == state)
            and all(w in f"{r['name']} {r['description']}".lower() for w in words)
        ),
        key=lambda r: str(r["name"]),
    )


def _approval(report: Any) -> str:
    if report is None:
        return "approved"
    if report.action == "withheld":
        return "pending"
    return "changed" if report.changed else "flagged" if report.findings else "approved"


def _offline_row(gateway: GatewayServer, name: str, server_id: str, state: str, report: Any) -> dict[str, Any]:
    """A tool that is not in the catalog, described from its server's current listing."""
    upstream = gateway.registry.upstreams.get(server_id)
    original = report.tool if report is not None else name.removeprefix(f"{upstream.spec.prefix}__" if upstream else "")
    tool = next((t for t in upstream.listing.tools if t.name == original), None) if upstream is not None else None
    return {
        "name": name,
        "server": server_id,
        "original": original,
        "description": (tool.description or "") if tool is not None else "",
        "state": state,
        "approval": _approval(report),
        "findings": report.lines() if report is not None else [],
        "input_schema": tool.input_schema if tool is not None else None,
    }


def _diff(old: str, new: str, label: str) -> str:
    lines = difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"approved {label}", f"current {label}"
    )
    return "".join(lines)


async def pending_approvals(gateway: GatewayServer) -> list[dict[str, Any]]:
    """Tools whose definition changed since approved (or whose description was flagged), with a unified
    diff of the description and of the input schema between the approved and the current definition."""
    vetter = gateway.vetter
    if vetter is None:
        return []
    store = vetter.store
    pending = await anyio.to_thread.run_sync(store.pending)
    reports = dict(vetter.reports)
    rows = []
    for stored in pending:
        approved = await anyio.to_thread.run_sync(store.definition, stored.approved)
        current = await anyio.to_thread.run_sync(store.definition, stored.pending) if stored.pending else None
        report = reports.get(stored.exposed)
        row: dict[str, Any] = {
            "name": stored.exposed,
            "server": stored.server,
            "tool": stored.tool,
            "withheld": report is not None and report.action == "withheld",
            "findings": report.lines() if report is not None else [],
            "approved_known": approved is not None,
        }
        if approved is not None and current is not None:
            old, new = json.loads(approved), json.loads(current)
            row["description_diff"] = _diff(old["description"] + "\n", new["description"] + "\n", "description")
            row["schema_diff"] = _diff(
                json.dumps(old["inputSchema"], indent=2, sort_keys=True) + "\n",
                json.dumps(new["inputSchema"], indent=2, sort_keys=True) + "\n",
                "inputSchema",
            )
        else:
            row["description_diff"] = row["schema_diff"] = None
            row["note"] = (
                "The approved definition was first seen before definitions were kept: only its fingerprint is known."
            )
        rows.append(row)
    flagged = {r["name"] for r in rows}
    for name, report in sorted(reports.items()):  # quarantined for their description, not changed
        if report.action == "withheld" and name not in flagged:
            rows.append(
                {
                    "name": name,
                    "server": report.server,
                    "tool": report.tool,
                    "withheld": True,
                    "findings": report.lines(),
                    "approved_known": True,
                    "description_diff": None,
                    "schema_diff": None,
                }
            )
    return rows


async def approve_tool(gateway: GatewayServer, name: str, *, by: Principal) -> dict[str, Any]:
    """Trust a tool's current definition and re-vet at once, so that it is listed and callable now."""
    vetter = gateway.vetter
    if vetter is None:
        raise ViewError(501, "not_implemented", "This gateway has no tool vetting to approve tools in.")
    found = await anyio.to_thread.run_sync(vetter.store.find, name)
    if not found:
        await audit_action(gateway, by, "approve", name, "refused: unknown tool")
        seen = [t.exposed for t in await anyio.to_thread.run_sync(vetter.store.pending)]
        raise _not_found("tool", name, seen + list(gateway.registry.catalog.tools))

    async def approve() -> list[str]:
        for stored in found:
            await anyio.to_thread.run_sync(vetter.store.approve, stored)
        await gateway.registry.revet()
        return [stored.exposed for stored in found]

    approved = await _audited(gateway, by, "approve", name, approve)
    return {"approved": approved, "callable": [n for n in approved if n in gateway.registry.catalog.tools]}


async def set_tool_enabled(gateway: GatewayServer, name: str, enabled: bool, *, by: Principal) -> dict[str, Any]:
    """Disable a tool at runtime (hidden from every list, refused on call) or enable it again."""
    switches = console_for(gateway).switches
    assert switches is not None
    known = set(gateway.registry.catalog.tools) | set(switches.disabled)
    if name not in known:
        await audit_action(gateway, by, "tool_enable" if enabled else "tool_disable", name, "refused: unknown tool")
        raise _not_found("tool", name, sorted(known))
    action = "tool_enable" if enabled else "tool_disable"
    changed = await _audited(gateway, by, action, name, switches.set_enabled, name, enabled, by.name)
    return {"tool": name, "enabled": enabled, "changed": changed}


async def reload(gateway: GatewayServer, *, by: Principal) -> dict[str, Any]:
    """Reload the config file now: the per-server diff is applied, an invalid file refused (`ReloadReport`)."""
    reloader = gateway.reloader
    if reloader is None:
        await audit_action(gateway, by, "reload", None, "refused: no live reload")
        raise ViewError(501, "not_implemented", "This gateway cannot reload its config live (no reloader is running).")
    report = await reloader.reload("api")
    answer: dict[str, Any] = report.as_dict()
    await audit_action(
        gateway, by, "reload", str(gateway.settings.config), "ok" if report.ok else f"refused: {report.error}"
    )
    if not report.ok:
        raise ViewError(422, "invalid_config", str(report.error))
    return answer


# ---- calls, search, feedback, config, audit -------------------------------------------


async def calls(
    gateway: GatewayServer,
    *,
    server: str | None = None,
    tool: str | None = None,
    status: str | None = None,
    since: float | None = None,
    limit: int = 100,
    before: float | None = None,
) -> dict[str, Any]:
    """Recent calls, newest first, filtered; `next_before` pages on (None at the end)."""
    try:
        flt = CallFilter(server=server, tool=tool, status=status, since=since, before=before, limit=limit)
    except ValueError as exc:
        raise ViewError(400, "bad_request", str(exc)) from None
    rows: list[dict[str, Any]] = await _read(gateway, lambda store: call_rows(store, flt), flush=True)
    return {"calls": rows, "next_before": rows[-1]["at"] if len(rows) == limit else None}


async def call(gateway: GatewayServer, execution_id: str) -> dict[str, Any]:
    """One call: redacted arguments (as stored), result summary, attempts, failures, feedback, latency."""
    found: dict[str, Any] | None = await _read(gateway, lambda store: call_detail(store, execution_id), flush=True)
    if found is None:
        raise ViewError(404, "not_found", f"There is no call {execution_id!r} in the records (or it was deleted).")
    if found.get("arguments"):
        try:
            found["arguments"] = json.loads(found["arguments"])
        except ValueError:
            pass  # a refused call's summary, or text cut to its limit: shown as stored
    return found


async def playground(gateway: GatewayServer, query: str, k: int) -> dict[str, Any]:
    """The router's ranking for `query`: total score and its parts (lexical, dense, learned) per tool.
    Not recorded as a search: it teaches the router nothing."""
    query = (query or "").strip()
    if not query:
        raise ViewError(400, "bad_request", "`q` must be a non-empty search request.")
    if not 1 <= k <= 50:
        raise ViewError(400, "bad_request", f"`k` must be from 1 to 50; got {k}.")
    service = gateway.router
    if service is None:
        raise ViewError(409, "no_router", "This gateway has no tool search.")
    hits = await service.search(query, k, 0.0)
    router = service.router
    parts = await anyio.to_thread.run_sync(explain, router, query, [h.name for h in hits]) if router else {}
    return {
        "query": query,
        "k": k,
        "ranking": router.description if router is not None else None,
        "no_fit_threshold": gateway.settings.routing.no_fit_threshold,
        "tools": [
            {
                "name": hit.name,
                "server": hit.record.server_id,
                "description": hit.record.tool.description or "",
                "score": round(hit.score, 4),
                "parts": (
                    {"lexical": p.lexical, "dense": p.dense, "learned": p.learned}
                    if (p := parts.get(hit.name)) is not None
                    else None
                ),
            }
            for hit in hits
        ],
    }


async def feedback(gateway: GatewayServer, limit: int = 100) -> list[dict[str, Any]]:
    """The latest feedback, newest first, with the rated call's server and tool."""
    try:
        return await _read(gateway, lambda store: feedback_rows(store, limit))  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ViewError(400, "bad_request", str(exc)) from None


async def audit(gateway: GatewayServer, limit: int = 100) -> list[dict[str, Any]]:
    """The latest admin actions, newest first."""
    try:
        return await _read(gateway, lambda store: audit_rows(store, limit))  # type: ignore[no-any-return]
    except ValueError as exc:
        raise ViewError(400, "bad_request", str(exc)) from None


def _secret_name(name: str) -> bool:
    lowered = name.lower()
    return lowered not in _NOT_SECRET and any(word in lowered for word in _SECRET_NAME)


def _masked(value: Any, mask: Callable[[str], str], key: str = "") -> Any:
    """`value` with every secret masked: values under secret-like keys, and known secret text anywhere."""
    if isinstance(value, dict):
        return {k: _masked(v, mask, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_masked(v, mask, key) for v in value]
    if isinstance(value, str):
        if key and _secret_name(key) and value:
            return MASK
        return mask(value)
    return value


def effective_config(gateway: GatewayServer) -> dict[str, Any]:
    """The loaded config and settings, every secret masked: env and header values, credentials, `${VAR}`
    substitutions, key hashes, the database URL's password, and each server's secrets wherever they appear."""
    registry = gateway.registry
    settings = gateway.settings.model_dump(mode="json")
    if settings.get("database_url"):
        settings["database_url"] = redact_url(settings["database_url"])

    def everywhere(text: str) -> str:
        for server_id in registry.upstreams:
            text = registry.redact(server_id, text)
        return text

    config: dict[str, Any] | None = None
    loaded = gateway.reloader.config if gateway.reloader is not None else gateway.config  # the reloaded one
    if loaded is not None:
        servers_out = {}
        for server_id, server_config in loaded.servers.items():
            dumped = server_config.model_dump(mode="json")
            dumped.update({k: v for k, v in server_config._masked.items()})  # `${VAR}` substitutions as written
            dumped["env"] = {k: MASK for k in server_config.env}
            dumped["headers"] = {k: MASK for k in server_config.headers}
            dumped["secret_env"] = {k: MASK for k in server_config.secret_env}
            dumped["secret_headers"] = {k: MASK for k in server_config.secret_headers}
            servers_out[server_id] = _masked(dumped, partial(registry.redact, server_id))
        auth = loaded.auth.model_dump(mode="json")
        for key in auth.get("api_keys", []):
            key["hash"] = MASK
        config = {
            "path": os.path.abspath(loaded.path),  # where it is, whatever folder the gateway started in
            "servers": servers_out,
            "plugins": _masked(loaded.plugins, everywhere),
            "auth": auth,
            "security": loaded.security.model_dump(mode="json"),
        }
    return {"settings": _masked(settings, everywhere), "config": config}
