"""MCP tasks (protocol 2025-11-25): task-augmented tool calls, proxied to the upstream that runs them.

A client that declared task support may call a tool with `task: {ttl}`; the server
that owns the tool creates the task and answers with a `CreateTaskResult`, and the
client then polls `tasks/get`, fetches `tasks/result`, lists with `tasks/list`,
cancels with `tasks/cancel`, and may receive `notifications/tasks/status`.

The gateway is the receiver downstream and the requestor upstream:

- **Task ids are mapped.** The id a client sees is an opaque `gwt-...` token the
  gateway makes, kept in memory with the server and that server's own task id, and
  scoped to the client session that created the task. Another session (or another
  client) gets "unknown task" for it, `tasks/list` lists only the session's own
  tasks, and two servers that happen to use the same ids never collide. Mappings
  end with the task's `ttl`, or when the server no longer knows the task.
- **Only what can be honoured is declared.** `capabilities.tasks` is declared to
  handshake-era clients at 2025-11-25 (tasks left the core protocol at 2026-07-28)
  when a connected server runs task-augmented `tools/call`, and never under
  stateless HTTP (no session to keep the mapping in). `cancel` is declared when one
  of those servers declares it.
- **A tool that requires tasks** (`execution.taskSupport: required`) is hidden from
  the listings and search results of a client that did not declare task support,
  with one log line per session: it could not call it. A call of it by name gets
  `task_required`.

Task-augmented calls skip the call chain's retries and records: creating a task is
not safe to repeat, and its result arrives later through `tasks/result`.
`notifications/tasks/status` of per-caller sessions (`forward_caller_token`) are not
relayed; the protocol makes them optional, and polling `tasks/get` always works.
"""

from __future__ import annotations

import logging
import math
import secrets
import weakref
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.server import Server, ServerRequestContext
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.exceptions import MCPError

from gateway.errors import GatewayError, error_result
from gateway.relay import connection_of
from gateway.security.http_guard import forwardable_token, principal_in
from gateway.serving.connect import caller_account
from gateway.serving.exposure import GATEWAY_TOOL_NAMES
from gateway.serving.hot_requests import passes_hot_requests
from gateway.serving.passthrough import expose_result_uris, forwarded_meta, relayed_error
from gateway.upstreams.tasks import TASKS_PROTOCOL_VERSION, runs_tasks, send_raw, task_support, tasks_of

if TYPE_CHECKING:
    from gateway.registry import Registry
    from gateway.upstreams.upstream import Upstream

__all__ = ["TaskProxy", "TaskTable", "client_supports_tasks"]

logger = logging.getLogger(__name__)

RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
MAX_TASKS_PER_SESSION = 1000
"""The oldest mappings of a session are forgotten beyond this many."""

Prepare = Callable[[ServerRequestContext[Any, Any], types.CallToolRequestParams], Awaitable[None]]
"""The checks a call passes before it goes upstream (scope, limits), raising `GatewayError`."""


def client_supports_tasks(ctx: ServerRequestContext[Any, Any]) -> bool:
    """Did this client declare task support, on the protocol revision that has tasks?"""
    caps = ctx.session.client_capabilities
    return ctx.protocol_version == TASKS_PROTOCOL_VERSION and caps is not None and caps.tasks is not None


@dataclass
class ProxiedTask:
    """One task as a client sees it (`exposed`) and as its server knows it (`server`, `task_id`)."""

    exposed: str
    server: str
    task_id: str
    tool: str
    session: weakref.ref[Any]
    expires_at: float


class TaskTable:
    """Exposed task ids, per client session; see the module docstring."""

    def __init__(self, max_per_session: int = MAX_TASKS_PER_SESSION) -> None:
        self.max_per_session = max_per_session
        self._by_session: weakref.WeakKeyDictionary[Any, dict[str, ProxiedTask]] = weakref.WeakKeyDictionary()
        self._by_upstream: dict[tuple[str, str], ProxiedTask] = {}

    def add(self, session: Any, server: str, task_id: str, tool: str, ttl_ms: int | None) -> ProxiedTask:
        """Map a task a server created for `session`; it is forgotten after its `ttl` (None: never)."""
        expires_at = math.inf if ttl_ms is None else anyio.current_time() + ttl_ms / 1000
        task = ProxiedTask("gwt-" + secrets.token_urlsafe(18), server, task_id, tool, weakref.ref(session), expires_at)
        tasks = self._by_session.setdefault(session, {})
        tasks[task.exposed] = task
        self._by_upstream[(server, task_id)] = task
        while len(tasks) > self.max_per_session:
            self.forget(next(iter(tasks.values())))
        return task

    def find(self, session: Any, exposed: str) -> ProxiedTask | None:
        """The session's task by its exposed id (None: unknown to this session, or expired)."""
        self._expire()
        return self._by_session.get(session, {}).get(exposed) if session is not None else None

    def of(self, session: Any) -> list[ProxiedTask]:
        self._expire()
        return list(self._by_session.get(session, {}).values()) if session is not None else []

    def by_upstream(self, server: str, task_id: str) -> ProxiedTask | None:
        task = self._by_upstream.get((server, task_id))
        return task if task is not None and task.session() is not None else None

    def for_client(self, server: str, request: types.InputRequest) -> types.InputRequest:
        """A question a server asks for one of its tasks, naming the task by the client's id."""
        meta = request.params.meta if request.params is not None else None
        related = meta.get(RELATED_TASK_META_KEY) if meta else None
        task_id = related.get("taskId") if isinstance(related, Mapping) else None
        task = self.by_upstream(server, task_id) if isinstance(task_id, str) else None
        if task is None or request.params is None or not isinstance(related, Mapping):
            return request
        renamed = {**(meta or {}), RELATED_TASK_META_KEY: {**related, "taskId": task.exposed}}
        params = request.params.model_copy(update={"meta": renamed})
        return request.model_copy(update={"params": params})

    def forget(self, task: ProxiedTask) -> None:
        self._by_upstream.pop((task.server, task.task_id), None)
        session = task.session()
        if session is not None:
            self._by_session.get(session, {}).pop(task.exposed, None)

    def _expire(self) -> None:
        now = anyio.current_time()
        for task in [t for t in self._by_upstream.values() if t.expires_at < now or t.session() is None]:
            self.forget(task)


def _any_tool(tool: types.Tool) -> bool:
    return True


def _not_task_required(tool: types.Tool) -> bool:
    """Whether a client that cannot run tasks can call `tool`."""
    return task_support(tool) != "required"


def _exposed(raw: Mapping[str, Any], task: ProxiedTask) -> dict[str, Any]:
    """A task object (or a result carrying related-task `_meta`) with the client's task id."""
    out = dict(raw)
    if "taskId" in out:
        out["taskId"] = task.exposed
    meta = out.get("_meta")
    if isinstance(meta, Mapping) and isinstance(meta.get(RELATED_TASK_META_KEY), Mapping):
        out["_meta"] = {**meta, RELATED_TASK_META_KEY: {**meta[RELATED_TASK_META_KEY], "taskId": task.exposed}}
    return out


def _not_a_task(name: str, why: str) -> MCPError:
    """The specification's answer to a task-augmented call of a tool that does not run as a task."""
    return MCPError(types.METHOD_NOT_FOUND, f"Tool {name!r} does not run as a task ({why}); call it without `task`.")


def _unknown_task(task_id: str) -> MCPError:
    return MCPError(
        types.INVALID_PARAMS,
        f"Unknown task {task_id!r}: it was not created in this session, or it expired. "
        "Task ids are valid only in the session that created the task.",
    )


class TaskProxy:
    """The task side of the gateway's downstream server (see the module docstring)."""

    def __init__(self, registry: Registry, prepare: Prepare, stateless: Callable[[], bool]) -> None:
        self.registry = registry
        self.prepare = prepare
        self.stateless = stateless
        self.table = TaskTable()
        self._told: weakref.WeakSet[Any] = weakref.WeakSet()
        self._notify: Callable[[Any, str, dict[str, Any]], Awaitable[None]] | None = None

    def install(self, server: Server[Any], notify: Callable[[Any, str, dict[str, Any]], Awaitable[None]]) -> None:
        """Serve the task methods on `server`; `notify(connection, method, params)` sends to one client."""
        self._notify = notify
        self.registry.relay.outgoing.append(self.table.for_client)
        server.middleware.append(self._task_augmented_call)
        server.add_request_handler("tasks/get", types.GetTaskRequestParams, self._get)
        server.add_request_handler("tasks/result", types.GetTaskPayloadRequestParams, self._result)
        server.add_request_handler("tasks/list", types.PaginatedRequestParams, self._list)
        server.add_request_handler("tasks/cancel", types.CancelTaskRequestParams, self._cancel)

    def capability(self) -> types.ServerTasksCapability | None:
        """What the gateway can honour now: None unless a connected server runs task-augmented calls."""
        capable = [u for u in self.registry.upstreams.values() if u.connected and runs_tasks(u)]
        if self.stateless() or not capable:
            return None
        cancel = any(getattr(tasks_of(u), "cancel", None) is not None for u in capable)
        calls = types.TasksToolsCapability(call=types.TasksCallCapability())
        return types.ServerTasksCapability(
            list=types.TasksListCapability(),
            cancel=types.TasksCancelCapability() if cancel else None,
            requests=types.ServerTasksRequestsCapability(tools=calls),
        )

    # ---- listings -------------------------------------------------------------------

    def usable(self, ctx: ServerRequestContext[Any, Any]) -> Callable[[types.Tool], bool]:
        """A filter for this client's listings: tools that require tasks go when it cannot run them."""
        if client_supports_tasks(ctx) and not self.stateless():
            return _any_tool
        return _not_task_required

    def note_hidden(self, ctx: ServerRequestContext[Any, Any], names: list[str]) -> None:
        """Log, once per client session, which tools it does not see for want of task support."""
        connection = connection_of(ctx)
        key = connection if connection is not None and not self.stateless() else self
        if not names or key in self._told:
            return
        self._told.add(key)
        logger.info(
            "hiding %d tool(s) that require MCP tasks from a client that did not declare task support "
            "(or cannot use it here): %s",
            len(names),
            ", ".join(sorted(names)),
        )

    # ---- tools/call with `task` ---------------------------------------------------------

    @passes_hot_requests  # a hot request is never task-augmented (`hot_requests.hot_shape`)
    async def _task_augmented_call(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call" or not isinstance(ctx.params, Mapping) or ctx.params.get("task") is None:
            return await call_next(ctx)
        if not client_supports_tasks(ctx) or self.capability() is None:
            return await call_next(ctx)  # a receiver that did not declare tasks processes the call normally
        params = types.CallToolRequestParams.model_validate(ctx.params, by_name=False)
        try:
            return await self._create(ctx, params)
        except GatewayError as exc:
            return error_result(exc)
        except MCPError as exc:
            raise relayed_error(exc) from None

    async def _create(self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams) -> dict[str, Any]:
        if params.name in GATEWAY_TOOL_NAMES and params.name not in self.registry.catalog.tools:
            raise _not_a_task(params.name, "it is one of the gateway's own tools")
        await self.prepare(ctx, params)
        upstream, entry = self.registry.tool(params.name)
        if not runs_tasks(upstream) or task_support(entry.item) == "forbidden":
            raise _not_a_task(params.name, "its server does not offer task-augmented calls for it")
        sent: dict[str, Any] = {
            "name": entry.original,
            "task": (params.task or types.TaskMetadata()).model_dump(exclude_none=True),
        }
        if params.arguments is not None:
            sent["arguments"] = params.arguments
        meta = forwarded_meta(ctx)
        if meta:
            sent["_meta"] = dict(meta)
        raw = await self._upstream(ctx, upstream, f"tools/call {params.name!r} as a task", "tools/call", sent)
        if not isinstance(raw.get("task"), Mapping):  # the server ran it as an ordinary call
            result = types.CallToolResult.model_validate(raw, by_name=False)
            return expose_result_uris(result, upstream.spec.prefix).model_dump(
                by_alias=True, mode="json", exclude_none=True
            )
        created = types.CreateTaskResult.model_validate(raw, by_name=False)
        task = self.table.add(connection_of(ctx), upstream.id, created.task.task_id, params.name, created.task.ttl)
        logger.info("task %s: %r on %r started (server task %s)", task.exposed, params.name, upstream.id, task.task_id)
        return {**raw, "task": _exposed(raw["task"], task)}

    # ---- tasks/* ------------------------------------------------------------------------

    async def _get(self, ctx: ServerRequestContext[Any, Any], params: types.GetTaskRequestParams) -> dict[str, Any]:
        task, upstream = self._lookup(ctx, params.task_id)
        return _exposed(await self._task_request(ctx, task, upstream, "tasks/get"), task)

    async def _result(
        self, ctx: ServerRequestContext[Any, Any], params: types.GetTaskPayloadRequestParams
    ) -> dict[str, Any]:
        """The task's result as the tool call would have returned it; blocks while the task runs."""
        task, upstream = self._lookup(ctx, params.task_id)
        with self.registry.relay.scope(upstream.id, ctx):  # questions the task asks go to this client
            raw = await self._task_request(ctx, task, upstream, "tasks/result", timeout=math.inf)
        if "content" in raw:  # a tool result: its resource links and embedded resources get exposed URIs
            result = expose_result_uris(types.CallToolResult.model_validate(raw, by_name=False), upstream.spec.prefix)
            raw = {**raw, "content": result.model_dump(by_alias=True, mode="json", exclude_none=True)["content"]}
        meta = raw.get("_meta")
        return {
            **raw,
            "_meta": {**(meta if isinstance(meta, Mapping) else {}), RELATED_TASK_META_KEY: {"taskId": task.exposed}},
        }

    async def _list(self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams) -> dict[str, Any]:
        """This session's tasks, each as its server reports it now (one page: the gateway makes no cursors)."""
        if params.cursor is not None:
            raise MCPError(types.INVALID_PARAMS, "Invalid cursor: the gateway lists all of a session's tasks at once.")
        listed = []
        for task in self.table.of(connection_of(ctx)):
            upstream = self.registry.upstreams.get(task.server)
            if upstream is None:
                continue
            try:
                listed.append(_exposed(await self._task_request(ctx, task, upstream, "tasks/get"), task))
            except MCPError as exc:
                if exc.code != types.INVALID_PARAMS:
                    raise relayed_error(exc) from None
                self.table.forget(task)  # the server no longer knows it
            except GatewayError as exc:
                logger.debug("tasks/list: task %s of %r left out: %s", task.exposed, task.server, exc.message)
        return {"tasks": listed}

    async def _cancel(
        self, ctx: ServerRequestContext[Any, Any], params: types.CancelTaskRequestParams
    ) -> dict[str, Any]:
        task, upstream = self._lookup(ctx, params.task_id)
        if getattr(tasks_of(upstream), "cancel", None) is None:
            raise MCPError(
                types.METHOD_NOT_FOUND,
                f"Server {upstream.id!r}, which runs task {task.exposed!r}, does not support tasks/cancel.",
            )
        return _exposed(await self._task_request(ctx, task, upstream, "tasks/cancel"), task)

    def _lookup(self, ctx: ServerRequestContext[Any, Any], task_id: str) -> tuple[ProxiedTask, Upstream]:
        task = self.table.find(connection_of(ctx), task_id)
        upstream = self.registry.upstreams.get(task.server) if task is not None else None
        if task is None or upstream is None:
            raise _unknown_task(task_id)
        return task, upstream

    async def _task_request(
        self,
        ctx: ServerRequestContext[Any, Any],
        task: ProxiedTask,
        upstream: Upstream,
        method: str,
        *,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        try:
            raw = await self._upstream(
                ctx, upstream, f"{method} {task.exposed!r}", method, {"taskId": task.task_id}, timeout
            )
        except GatewayError as exc:
            raise MCPError(types.INTERNAL_ERROR, exc.message, {"code": exc.code, "server": exc.server}) from None
        except MCPError as exc:
            if exc.code == types.INVALID_PARAMS and method != "tasks/cancel":
                self.table.forget(task)
            raise relayed_error(exc) from None
        return raw

    async def _upstream(
        self,
        ctx: ServerRequestContext[Any, Any],
        upstream: Upstream,
        operation: str,
        method: str,
        params: dict[str, Any],
        timeout: float | None = None,
    ) -> dict[str, Any]:
        token = forwardable_token(ctx.request)
        result: dict[str, Any] = await self.registry.request_as(
            token,
            upstream,
            operation,
            lambda client: send_raw(client, method, params),
            timeout=timeout,
            account=caller_account(principal_in(ctx.request)),
        )
        return result

    # ---- notifications/tasks/status -------------------------------------------------------

    async def on_status(self, server: str, params: types.TaskStatusNotificationParams) -> None:
        """Pass a server's task status change to the client session that owns the task."""
        task = self.table.by_upstream(server, params.task_id)
        session = task.session() if task is not None else None
        if task is None or session is None or self._notify is None:
            logger.debug("task status from %r for a task no client session owns: %s", server, params.task_id)
            return
        wire = params.model_dump(by_alias=True, mode="json", exclude_none=True)
        wire.setdefault("ttl", None)  # required, and null means unlimited
        await self._notify(session, "notifications/tasks/status", _exposed(wire, task))
