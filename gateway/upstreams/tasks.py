"""What the gateway, as a client, knows of an upstream's MCP tasks (protocol 2025-11-25).

Whether a server runs task-augmented `tools/call`, a tool's `taskSupport`, sending the
task requests the SDK does not model, and receiving `notifications/tasks/status`. The
downstream side, the task ids a client sees and their proxying, is `gateway.serving.tasks`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp import Client
from mcp.client.extension import ClientExtension, NotificationBinding

if TYPE_CHECKING:
    from gateway.upstreams.upstream import Upstream

__all__ = ["TASKS_PROTOCOL_VERSION", "TaskStatusExtension", "runs_tasks", "send_raw", "task_support", "tasks_of"]

TASKS_PROTOCOL_VERSION = "2025-11-25"
"""The one protocol revision with tasks in its core (2026-07-28 moved them to an extension)."""


def task_support(tool: types.Tool) -> str:
    """`forbidden` (the default), `optional` or `required`."""
    return (tool.execution.task_support if tool.execution is not None else None) or "forbidden"


def tasks_of(upstream: Upstream) -> types.ServerTasksCapability | None:
    """The server's `tasks` capability, on a connection at the revision that has tasks."""
    caps = upstream.server_capabilities
    if upstream.protocol_version != TASKS_PROTOCOL_VERSION or caps is None:
        return None
    return caps.tasks


def runs_tasks(upstream: Upstream) -> bool:
    """Does this server take task-augmented `tools/call` on the connection the gateway has to it?"""
    tasks = tasks_of(upstream)
    requests = tasks.requests if tasks is not None else None
    return requests is not None and requests.tools is not None and requests.tools.call is not None


async def send_raw(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a request whose result the SDK does not model, and return the result as sent.

    mcp 2.3 defines the task types but does not dispatch them, and validates a
    `tools/call` result as a `CallToolResult`, which a `CreateTaskResult` is not. So
    the request goes out on the session's dispatcher (not public API in mcp 2.3), with
    the same per-request stamp the SDK's own requests get.
    """
    session = client.session
    data: dict[str, Any] = {"method": method, "params": params}
    opts: dict[str, Any] = {}
    session._stamp(data, opts)  # type: ignore[arg-type]
    return await session._dispatcher.send_raw_request(method, data.get("params"), opts)  # type: ignore[arg-type]


class TaskStatusExtension(ClientExtension):
    """Lets an upstream session receive `notifications/tasks/status` (mcp 2.3 delivers a
    notification outside its core tables only to an extension's binding)."""

    identifier = "io.github.mcp-gateway/task-status"

    def __init__(self, handler: Callable[[types.TaskStatusNotificationParams], Awaitable[None]]) -> None:
        self.handler = handler

    def notifications(self) -> list[NotificationBinding[Any]]:
        return [
            NotificationBinding(
                method="notifications/tasks/status",
                params_type=types.TaskStatusNotificationParams,
                handler=self.handler,
            )
        ]
