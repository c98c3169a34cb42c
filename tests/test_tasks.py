"""MCP tasks through the gateway: a real task-running upstream, and clients with and without task support.

The upstream is `@modelcontextprotocol/server-everything` (npm, pinned in
`tests.everything`), whose `simulate-research-query` requires tasks. The client that
supports tasks speaks JSON-RPC itself over the gateway's stdio (`python -m gateway
serve`): the SDK's client (mcp 2.3) cannot declare the `tasks` capability. The client
that does not is the SDK's own.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import httpx
import mcp_types as types
import pytest

from gateway.errors import ERROR_META_KEY
from gateway.serving.tasks import TaskTable
from tests.conftest import REPO, gateway_env, gateway_over_stdio, start_gateway_http, stop_process, write_config
from tests.everything import everything_command

pytestmark = pytest.mark.anyio

TOOL = "every__simulate-research-query"
RELATED = "io.modelcontextprotocol/related-task"


class RawError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.code, self.message = error.get("code"), error.get("message", "")


class RawClient:
    """A JSON-RPC 2.0 client over a child's stdin/stdout that keeps the notifications it gets."""

    def __init__(self, process: anyio.abc.Process) -> None:
        self.process = process
        self.notifications: list[dict[str, Any]] = []
        self.asked: list[dict[str, Any]] = []
        """Requests the gateway sent this client (it answers elicitation by accepting `answer`)."""
        self.answer: dict[str, Any] = {}
        self._next_id = 0
        self._waiting: dict[int, tuple[anyio.Event, list[dict[str, Any]]]] = {}
        self._changed = anyio.Event()

    async def read(self) -> None:
        assert self.process.stdout is not None
        buffer = b""
        async for chunk in self.process.stdout:
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    await self._dispatch(json.loads(line))

    async def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message and ("result" in message or "error" in message):
            event, box = self._waiting.pop(message["id"])
            box.append(message)
            event.set()
        elif "id" in message:  # a request to the client: ping, and elicitation when it declared it
            self.asked.append(message)
            if message["method"] == "ping":
                reply: dict[str, Any] = {"result": {}}
            elif message["method"] == "elicitation/create":
                reply = {"result": {"action": "accept", "content": self.answer}}
            else:
                reply = {"error": {"code": -32601, "message": "Method not found"}}
            await self._send({"jsonrpc": "2.0", "id": message["id"], **reply})
        else:
            self.notifications.append(message)
            self._changed.set()
            self._changed = anyio.Event()

    async def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(json.dumps(message).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        event, box = anyio.Event(), []
        self._waiting[self._next_id] = (event, box)
        await self._send({"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}})
        await event.wait()
        if "error" in box[0]:
            raise RawError(box[0]["error"])
        result: dict[str, Any] = box[0]["result"]
        return result

    async def notify(self, method: str) -> None:
        await self._send({"jsonrpc": "2.0", "method": method})

    async def wait_for_notification(self, method: str) -> dict[str, Any]:
        while True:
            for message in self.notifications:
                if message["method"] == method:
                    return message
            await self._changed.wait()


@asynccontextmanager
async def raw_gateway(
    config: Path, tmp_path: Path, capabilities: dict[str, Any], env: dict[str, str] | None = None
) -> AsyncIterator[RawClient]:
    """`python -m gateway serve` over stdio, initialized at 2025-11-25 with `capabilities`."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = gateway_env(tmp_path) | {"GATEWAY_LOG_LEVEL": "INFO"} | (env or {})
    command = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"]
    with (tmp_path / "gateway.log").open("ab") as log:
        async with await anyio.open_process(command, env=env, cwd=REPO, stderr=log) as process:
            client = RawClient(process)
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.read)
                client.initialized = await client.request(  # type: ignore[attr-defined]
                    "initialize",
                    {
                        "protocolVersion": "2025-11-25",
                        "capabilities": capabilities,
                        "clientInfo": {"name": "raw-test-client", "version": "1"},
                    },
                )
                await client.notify("notifications/initialized")
                try:
                    yield client
                finally:
                    assert process.stdin is not None
                    await process.stdin.aclose()
                    with anyio.move_on_after(10):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                    tg.cancel_scope.cancel()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    return write_config(
        tmp_path / "gateway.yaml", f"mcps:\n  every:\n    command: {everything_command()}\n    args: [stdio]\n"
    )


TASKS = {"list": {}, "cancel": {}}


async def listed_tool(client: RawClient | HttpRawClient, name: str) -> dict[str, Any]:
    """The tool from tools/list, once it is there (the server adds it when its client has initialized)."""
    while True:
        tools = {t["name"]: t for t in (await client.request("tools/list"))["tools"]}
        if name in tools:
            return tools[name]
        await anyio.sleep(0.1)


async def test_a_client_with_task_support_runs_a_tool_that_requires_tasks_through_the_gateway(
    config: Path, tmp_path: Path
) -> None:
    with anyio.fail_after(90):
        async with raw_gateway(config, tmp_path, {"tasks": TASKS}) as client:
            declared = client.initialized["capabilities"]["tasks"]  # type: ignore[attr-defined]
            assert declared == {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}
            tool = await listed_tool(client, TOOL)
            assert tool["execution"] == {"taskSupport": "required"}

            created = await client.request(
                "tools/call", {"name": TOOL, "arguments": {"topic": "gateways"}, "task": {"ttl": 60000}}
            )
            task = created["task"]
            task_id = task["taskId"]
            assert task_id.startswith("gwt-") and task["status"] == "working"
            assert (await client.request("tasks/get", {"taskId": task_id}))["taskId"] == task_id
            listed = (await client.request("tasks/list"))["tasks"]
            assert [t["taskId"] for t in listed] == [task_id]

            result = await client.request("tasks/result", {"taskId": task_id})  # blocks until it is done
            assert "# Research Report: gateways" in result["content"][0]["text"]
            assert result["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
            done = await client.request("tasks/get", {"taskId": task_id})
            assert done["status"] == "completed" and done["taskId"] == task_id

            with pytest.raises(RawError) as refused:  # the server's own refusal, relayed
                await client.request("tasks/cancel", {"taskId": task_id})
            assert refused.value.code == types.INVALID_PARAMS
            assert refused.value.message == "Cannot cancel task in terminal status: completed"
            # The server announced its status changes; the client got them under its own task id.
            statuses = [n["params"] for n in client.notifications if n["method"] == "notifications/tasks/status"]
            assert statuses and {s["taskId"] for s in statuses} == {task_id}
            assert "completed" in {s["status"] for s in statuses}


async def test_a_running_task_is_cancelled_through_the_gateway(config: Path, tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with raw_gateway(config, tmp_path, {"tasks": TASKS}) as client:
            await listed_tool(client, TOOL)
            with pytest.raises(RawError) as refused:  # a tool that does not run as a task, asked to
                await client.request("tools/call", {"name": "every__echo", "arguments": {"message": "x"}, "task": {}})
            assert refused.value.code == types.METHOD_NOT_FOUND and "does not run as a task" in refused.value.message
            with pytest.raises(RawError) as own:
                await client.request("tools/call", {"name": "search_tools", "arguments": {"query": "x"}, "task": {}})
            assert own.value.code == types.METHOD_NOT_FOUND and "gateway's own tools" in own.value.message
            created = await client.request("tools/call", {"name": TOOL, "arguments": {"topic": "x"}, "task": {}})
            task_id = created["task"]["taskId"]
            cancelled = await client.request("tasks/cancel", {"taskId": task_id})
            assert cancelled["taskId"] == task_id and cancelled["status"] == "cancelled"
            assert (await client.request("tasks/get", {"taskId": task_id}))["status"] == "cancelled"


async def task_tool_called(client: RawClient | HttpRawClient) -> dict[str, Any]:
    """Call the task tool without a task, once the gateway knows it (the server adds it after start-up)."""
    while True:
        result = await client.request("tools/call", {"name": TOOL, "arguments": {"topic": "x"}})
        if result.get("_meta", {}).get(ERROR_META_KEY, {}).get("code") != "tool_not_found":
            return result
        await anyio.sleep(0.1)


class HttpRawClient:
    """One JSON-RPC session over the gateway's streamable HTTP (2025-11-25), declaring `capabilities`."""

    def __init__(self, http: httpx.AsyncClient, url: str) -> None:
        self.http, self.url = http, url
        self.session_id: str | None = None
        self._next_id = 0

    async def _post(self, message: dict[str, Any]) -> list[dict[str, Any]]:
        headers = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
        if self.session_id is not None:
            headers["Mcp-Session-Id"] = self.session_id
        response = await self.http.post(self.url, json=message, headers=headers)
        assert response.status_code in (200, 202), response.text
        self.session_id = response.headers.get("mcp-session-id", self.session_id)
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            return [json.loads(line[5:]) for line in response.text.splitlines() if line.startswith("data:")]
        return [response.json()] if response.content else []

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        self._next_id += 1
        sent = {"jsonrpc": "2.0", "id": self._next_id, "method": method, "params": params or {}}
        (reply,) = [m for m in await self._post(sent) if m.get("id") == self._next_id]
        if "error" in reply:
            raise RawError(reply["error"])
        result: dict[str, Any] = reply["result"]
        return result

    async def start(self, capabilities: dict[str, Any]) -> dict[str, Any]:
        info = {"name": "raw-http-client", "version": "1"}
        params = {"protocolVersion": "2025-11-25", "capabilities": capabilities, "clientInfo": info}
        initialized = await self.request("initialize", params)
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return initialized


async def test_task_ids_are_valid_only_in_the_session_that_created_the_task(config: Path, tmp_path: Path) -> None:
    process, url = start_gateway_http(config, tmp_path)
    try:
        with anyio.fail_after(90):
            async with httpx.AsyncClient(timeout=60) as http:
                first, second = HttpRawClient(http, url), HttpRawClient(http, url)
                assert "tasks" in (await first.start({"tasks": TASKS}))["capabilities"]
                await second.start({"tasks": TASKS})
                await listed_tool(first, TOOL)
                created = await first.request("tools/call", {"name": TOOL, "arguments": {"topic": "x"}, "task": {}})
                task_id = created["task"]["taskId"]
                with pytest.raises(RawError) as unknown:
                    await second.request("tasks/get", {"taskId": task_id})
                assert unknown.value.code == types.INVALID_PARAMS and "Unknown task" in unknown.value.message
                assert (await second.request("tasks/list"))["tasks"] == []
                with pytest.raises(RawError):
                    await second.request("tasks/cancel", {"taskId": task_id})
                assert (await first.request("tasks/get", {"taskId": task_id}))["taskId"] == task_id
                assert [t["taskId"] for t in (await first.request("tasks/list"))["tasks"]] == [task_id]
    finally:
        stop_process(process)


async def test_a_client_without_task_support_does_not_see_tools_that_require_tasks(
    config: Path, tmp_path: Path
) -> None:
    with anyio.fail_after(90):
        async with raw_gateway(config, tmp_path, {}) as client:
            result = await task_tool_called(client)
            assert result["isError"] and result["_meta"][ERROR_META_KEY]["code"] == "task_required"
            assert "runs only as an MCP task" in result["content"][0]["text"]
            for _ in range(3):
                names = {t["name"] for t in (await client.request("tools/list"))["tools"]}
                assert "every__echo" in names and TOOL not in names
    hidden = [line for line in (tmp_path / "gateway.log").read_text().splitlines() if "require MCP tasks" in line]
    assert len(hidden) == 1 and TOOL in hidden[0], hidden


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_sdk_client_which_has_no_task_support_is_refused_a_task_required_tool_clearly(
    config: Path, tmp_path: Path, mode: str
) -> None:
    with anyio.fail_after(90):
        async with gateway_over_stdio(config, tmp_path, mode=mode) as client:
            while True:  # the server adds its task tool once its own client (the gateway) has initialized
                result = await client.call_tool(TOOL, {"topic": "x"})
                if (result.meta or {}).get(ERROR_META_KEY, {}).get("code") != "tool_not_found":
                    break
                await anyio.sleep(0.1)
            assert result.is_error and result.meta is not None
            assert result.meta[ERROR_META_KEY]["code"] == "task_required"
            assert TOOL not in {t.name for t in (await client.list_tools()).tools}


async def test_a_question_the_task_asks_reaches_the_client_waiting_for_its_result(config: Path, tmp_path: Path) -> None:
    with anyio.fail_after(90):
        async with raw_gateway(config, tmp_path, {"tasks": TASKS, "elicitation": {}}) as client:
            client.answer = {"interpretation": "historical"}
            await listed_tool(client, TOOL)
            arguments = {"topic": "python", "ambiguous": True}
            created = await client.request("tools/call", {"name": TOOL, "arguments": arguments, "task": {}})
            task_id = created["task"]["taskId"]
            result = await client.request("tasks/result", {"taskId": task_id})
            assert "Research Report: python (historical)" in result["content"][0]["text"]
            [question] = [m["params"] for m in client.asked if m["method"] == "elicitation/create"]
            assert "multiple interpretations" in question["message"]
            assert question.get("_meta", {}).get(RELATED, {}).get("taskId", task_id) == task_id
            statuses = [n["params"] for n in client.notifications if n["method"] == "notifications/tasks/status"]
            assert "input_required" in {s["status"] for s in statuses}


async def test_search_finds_a_tool_that_requires_tasks_only_for_a_client_that_supports_them(
    config: Path, tmp_path: Path
) -> None:
    search = {"GATEWAY_ROUTING__MODE": "search"}
    query = {"name": "search_tools", "arguments": {"query": "simulate a deep research query", "limit": 50}}
    with anyio.fail_after(120):
        for capabilities, found in (({"tasks": TASKS}, True), ({}, False)):
            async with raw_gateway(config, tmp_path / str(found), capabilities, search) as client:
                await task_tool_called(client)  # the gateway knows the tool by now
                hits = (await client.request("tools/call", query))["structuredContent"]["tools"]
                assert (TOOL in {h["name"] for h in hits}) is found


async def test_under_stateless_http_tasks_are_not_declared_and_tools_that_require_them_are_hidden(
    config: Path, tmp_path: Path
) -> None:
    process, url = start_gateway_http(config, tmp_path, {"GATEWAY_HTTP__STATELESS": "true"})
    try:
        with anyio.fail_after(90):
            async with httpx.AsyncClient(timeout=60) as http:
                client = HttpRawClient(http, url)
                assert "tasks" not in (await client.start({"tasks": TASKS}))["capabilities"]
                result = await task_tool_called(client)
                assert result["_meta"][ERROR_META_KEY]["code"] == "task_required"
                assert TOOL not in {t["name"] for t in (await client.request("tools/list"))["tools"]}
    finally:
        stop_process(process)


async def test_tasks_are_not_declared_when_no_server_runs_them(tmp_path: Path) -> None:
    demo = REPO / "tests" / "servers" / "demo_server.py"
    config = write_config(
        tmp_path / "gateway.yaml", f"mcps:\n  child:\n    command: {sys.executable}\n    args: ['{demo}', stdio]\n"
    )
    with anyio.fail_after(60):
        async with raw_gateway(config, tmp_path, {"tasks": TASKS}) as client:
            assert "tasks" not in client.initialized["capabilities"]  # type: ignore[attr-defined]
            # Undeclared, a task-augmented request is processed normally (the specification's rule).
            echoed = await client.request("tools/call", {"name": "child__echo", "arguments": {"text": "x"}, "task": {}})
            assert echoed["content"] == [{"type": "text", "text": "x"}]
            with pytest.raises(RawError) as unknown:
                await client.request("tasks/get", {"taskId": "gwt-nothing"})
            assert unknown.value.code == types.INVALID_PARAMS


def test_a_question_relayed_for_a_task_names_the_task_by_the_clients_id() -> None:
    async def body() -> None:
        table = TaskTable()

        class Session:
            pass

        session = Session()
        task = table.add(session, "every", "server-id-1", TOOL, ttl_ms=None)
        params = types.ElicitRequestFormParams(
            message="which?", requested_schema={"type": "object"}, _meta={RELATED: {"taskId": "server-id-1"}}
        )
        asked = table.for_client("every", types.ElicitRequest(params=params))
        assert asked.params.meta == {RELATED: {"taskId": task.exposed}}
        other = table.for_client("other", types.ElicitRequest(params=params))
        assert other.params.meta == {RELATED: {"taskId": "server-id-1"}}  # not this server's task: unchanged

    anyio.run(body)


def test_the_task_table_forgets_a_task_after_its_ttl_and_knows_only_its_own_session() -> None:
    async def body() -> None:
        table = TaskTable(max_per_session=2)

        class Session:
            pass

        one, two = Session(), Session()
        short = table.add(one, "every", "t1", "every__x", ttl_ms=0)
        kept = table.add(one, "every", "t2", "every__x", ttl_ms=None)
        assert table.find(two, kept.exposed) is None
        assert table.by_upstream("every", "t2") is kept
        await anyio.sleep(0.01)
        assert table.find(one, short.exposed) is None and table.find(one, kept.exposed) is kept
        table.add(one, "other", "t2", "other__y", ttl_ms=None)  # the same server id on another server
        table.add(one, "every", "t3", "every__x", ttl_ms=None)  # over the cap: the oldest goes
        assert table.find(one, kept.exposed) is None and len(table.of(one)) == 2

    anyio.run(body)
