"""End to end: the SDK's real client -> the gateway (stdio or HTTP) -> three real upstreams.

Upstreams: `mem` (an in-memory plugin server, from the fixture plugin directory),
`child` (a stdio child process) and `web` (streamable HTTP on 127.0.0.1). Every test
runs against both downstream transports and both protocol eras of the client.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, MCPError
from mcp.shared.exceptions import MCPDeprecationWarning

from gateway.errors import naming_exposed_tool
from gateway.serving.passthrough import relayed_error
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    gateway_over_http,
    gateway_over_stdio,
    start_demo_http,
    stop_process,
    three_upstream_config,
    write_config,
)
from tests.everything import everything_command

pytestmark = pytest.mark.anyio

EVERY_TOOL = NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all"}
"""These tests are about aggregation, so every tool is listed: three demo servers are more
than 40 tools, past which the default `auto` mode would show them through the router."""

Connect = Callable[..., AbstractAsyncContextManager[Client]]


@pytest.fixture(params=["stdio", "http"])
def transport(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=["auto", "legacy"])
def mode(request: pytest.FixtureRequest) -> str:
    """`auto` negotiates 2026-07-28 with the gateway; `legacy` uses the initialize handshake."""
    return request.param


@pytest.fixture
def connect(transport: str, mode: str, tmp_path: Path, demo_http_url: str) -> Connect:
    config = three_upstream_config(tmp_path, demo_http_url)
    opener = gateway_over_stdio if transport == "stdio" else gateway_over_http

    def open_client(**kwargs: Any) -> AbstractAsyncContextManager[Client]:
        return opener(config, tmp_path, EVERY_TOOL, mode=mode, **kwargs)

    return open_client


async def _sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
    question = params.messages[0].content
    text = question.text if isinstance(question, types.TextContent) else "?"
    return types.CreateMessageResult(
        role="assistant", content=types.TextContent(type="text", text=f"an answer to {text!r}"), model="test-model"
    )


async def test_tools_resources_and_prompts_of_all_three_upstreams_are_listed_under_namespaced_names(
    connect: Connect,
) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            for server in ("mem", "child", "web"):
                assert {f"{server}__echo", f"{server}__add", f"{server}__ask_llm"} <= tools
            resources = {r.uri for r in (await client.list_resources()).resources}
            assert {"mem+demo://readme", "child+demo://readme", "web+demo://readme"} <= resources
            templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
            assert "child+demo://items/{item_id}" in templates
            prompts = {p.name for p in (await client.list_prompts()).prompts}
            assert {"mem__greet", "child__greet", "web__greet"} <= prompts


async def test_namespaced_tools_resources_and_prompts_are_callable_on_every_upstream(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            for server in ("mem", "child", "web"):
                result = await client.call_tool(f"{server}__add", {"a": 2, "b": 40})
                assert not result.is_error
                assert result.structured_content == {"result": 42}
                readme = await client.read_resource(f"{server}+demo://readme")
                assert readme.contents[0].uri == f"{server}+demo://readme"
                assert isinstance(readme.contents[0], types.TextResourceContents)
                assert readme.contents[0].text == f"{server} readme"
                item = await client.read_resource(f"{server}+demo://items/7")
                assert isinstance(item.contents[0], types.TextResourceContents)
                assert item.contents[0].text == "item 7"
                prompt = await client.get_prompt(f"{server}__greet", {"who": "Ada"})
                assert isinstance(prompt.messages[0].content, types.TextContent)
                assert prompt.messages[0].content.text == "Hello, Ada!"


async def test_an_error_the_upstream_returns_passes_through_naming_the_tool_the_client_called(
    connect: Connect,
) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            result = await client.call_tool("child__fail", {"message": "boom at the upstream"})
            assert result.is_error
            # The SDK server wrote "Error executing tool fail: ..."; the model only knows `child__fail`.
            assert result.content[0].text == "Error executing tool child__fail: boom at the upstream"  # type: ignore[union-attr]
            assert "mcp-gateway/error" not in (result.meta or {})


def test_only_the_tool_name_after_the_word_tool_is_replaced_in_an_upstream_error() -> None:
    def text(words: str) -> str:
        result = types.CallToolResult(content=[types.TextContent(type="text", text=words)], is_error=True)
        block = naming_exposed_tool(result, "now", "clock__now").content[0]
        assert isinstance(block, types.TextContent)
        return block.text

    assert text("Error executing tool now: not now, nowhere") == "Error executing tool clock__now: not now, nowhere"
    assert text("Tool 'now' not found") == "Tool 'clock__now' not found"
    assert text("Error executing tool nowhere: x") == "Error executing tool nowhere: x"


async def test_an_unknown_tool_gets_a_tool_not_found_result_with_close_names(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            result = await client.call_tool("child__ech", {"text": "x"})
            assert result.is_error
            assert (result.meta or {})["mcp-gateway/error"]["code"] == "tool_not_found"
            assert "child__echo" in result.content[0].text  # type: ignore[union-attr]


async def test_progress_notifications_from_an_upstream_reach_the_client(connect: Connect) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    with anyio.fail_after(60):
        async with connect() as client:
            for server in ("mem", "child", "web"):
                seen.clear()
                result = await client.call_tool(f"{server}__count_slowly", {"steps": 3}, progress_callback=on_progress)
                assert result.content[0].text == "counted to 3"  # type: ignore[union-attr]
                assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_a_sampling_request_from_an_upstream_is_relayed_to_the_client(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect(sampling_callback=_sampling) as client:
            for server in ("mem", "child", "web"):
                result = await client.call_tool(f"{server}__ask_llm", {"question": "what is 6*7?"})
                assert not result.is_error, result
                assert result.content[0].text == "LLM said: an answer to 'what is 6*7?'"  # type: ignore[union-attr]


async def test_a_client_without_sampling_gets_a_clear_refusal_instead_of_a_hang(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            # The upstream turns the refusal into its own JSON-RPC error, which passes through.
            with pytest.raises(
                MCPError, match="asked for sampling, which the client connected to the gateway does not support"
            ):
                await client.call_tool("child__ask_llm", {"question": "anyone?"})


async def test_a_list_changed_from_an_upstream_reaches_the_client(connect: Connect, mode: str) -> None:
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def tool_names() -> set[str]:
        return {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}

    with anyio.fail_after(60):
        async with connect(message_handler=on_message) as client:
            assert "child__grown" not in await tool_names()
            if mode == "legacy":
                changed = anyio.Event()
                await client.call_tool("child__grow", {})
                # Notifications about servers that finished starting may come first: a
                # client re-lists on each one, as a real client does.
                while True:
                    await changed.wait()
                    changed = anyio.Event()
                    if "child__grown" in await tool_names():
                        break
            else:
                async with client.listen(tools_list_changed=True) as subscription:
                    await client.call_tool("child__grow", {})
                    async for event in subscription:
                        assert type(event).__name__ == "ToolsListChanged"
                        if "child__grown" in await tool_names():
                            break
            result = await client.call_tool("child__grown", {})
            assert result.content[0].text == "grown"  # type: ignore[union-attr]


async def test_an_upstream_that_fails_to_start_leaves_the_others_serving(
    transport: str, mode: str, tmp_path: Path, demo_http_url: str
) -> None:
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          web:
            url: {demo_http_url}
          missing:
            command: /nonexistent/mcp-server
          refused:
            url: http://127.0.0.1:9/mcp
        """,
    )
    opener = gateway_over_stdio if transport == "stdio" else gateway_over_http
    with anyio.fail_after(60):
        async with opener(config, tmp_path, EVERY_TOOL, mode=mode) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "web__echo" in tools and "mem__echo" in tools
            assert not any(t.startswith(("missing__", "refused__")) for t in tools)
            result = await client.call_tool("web__echo", {"text": "still here"})
            assert result.content[0].text == "still here"  # type: ignore[union-attr]


async def test_completion_requests_reach_the_upstream_of_a_template_or_prompt(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            ref = types.ResourceTemplateReference(uri="web+demo://items/{item_id}")
            completed = await client.complete(ref, {"name": "item_id", "value": "4"})
            assert completed.completion.values == ["42", "420"]
            prompt_ref = types.PromptReference(name="child__greet")
            completed = await client.complete(prompt_ref, {"name": "who", "value": "A"})
            assert completed.completion.values == ["Ada", "Alan"]


async def test_resource_update_notifications_reach_a_subscribed_client(connect: Connect, mode: str) -> None:
    updated = anyio.Event()
    uri = "child+demo://readme"

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification) and message.params.uri == uri:
            updated.set()

    with anyio.fail_after(60):
        async with connect(message_handler=on_message) as client:
            if mode == "legacy":
                with pytest.warns(MCPDeprecationWarning):
                    await client.subscribe_resource(uri)
                await client.call_tool("child__touch_readme", {})
                await updated.wait()
            else:
                async with client.listen(resource_subscriptions=[uri]) as subscription:
                    await client.call_tool("child__touch_readme", {})
                    async for event in subscription:
                        assert getattr(event, "uri", None) == uri
                        break


async def test_lists_are_paginated_downstream_when_they_exceed_the_page_size(
    transport: str, mode: str, tmp_path: Path, demo_http_url: str
) -> None:
    config = three_upstream_config(tmp_path, demo_http_url)
    opener = gateway_over_stdio if transport == "stdio" else gateway_over_http
    with anyio.fail_after(60):
        async with opener(config, tmp_path, env=EVERY_TOOL | {"GATEWAY_PAGE_SIZE": "4"}, mode=mode) as client:
            pages: list[list[str]] = []
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                pages.append([t.name for t in page.tools])
                cursor = page.next_cursor
                if cursor is None:
                    break
            names = [name for page in pages for name in page]
            per_server = len([n for n in names if n.startswith("web__")])
            assert len(names) == len(set(names)) == 3 * per_server + 1  # and the gateway's submit_feedback
            assert "submit_feedback" in names
            full, rest = divmod(len(names), 4)
            assert [len(page) for page in pages] == [4] * full + ([rest] if rest else [])
            assert {"mem__echo", "child__echo", "web__echo"} <= set(names)
            with pytest.raises(MCPError, match="Invalid cursor"):
                await client.list_tools(cursor="not-a-cursor")


async def test_a_legacy_sse_upstream_is_served_like_any_other(tmp_path: Path) -> None:
    process, url = start_demo_http("legacy", transport="sse")
    try:
        config = write_config(tmp_path / "gateway.yaml", f"mcps:\n  old:\n    url: {url}\n    transport: sse\n")
        with anyio.fail_after(60):
            async with gateway_over_stdio(config, tmp_path, EVERY_TOOL) as client:
                result = await client.call_tool("old__add", {"a": 1, "b": 1})
                assert result.structured_content == {"result": 2}
                readme = await client.read_resource("old+demo://readme")
                assert readme.contents[0].text == "legacy readme"  # type: ignore[union-attr]
    finally:
        stop_process(process)


async def test_two_servers_with_the_same_names_and_no_prefix_both_stay_reachable(
    tmp_path: Path, demo_http_url: str
) -> None:
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          first:
            url: {demo_http_url}
            prefix: ""
          second:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, second]
            prefix: ""
        """,
    )
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path, EVERY_TOOL) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["echo"].meta == {"mcp-gateway/server": "first"}
            assert tools["second__echo"].meta == {"mcp-gateway/server": "second"}
            first = await client.read_resource("demo://readme")
            second = await client.read_resource("second+demo://readme")
            assert first.contents[0].text == "web readme"  # type: ignore[union-attr]
            assert second.contents[0].text == "second readme"  # type: ignore[union-attr]


async def test_an_elicitation_request_from_an_upstream_is_relayed_to_the_client(connect: Connect) -> None:
    asked: list[str] = []

    async def on_elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"ok": True})

    with anyio.fail_after(60):
        async with connect(elicitation_callback=on_elicit) as client:
            for server in ("mem", "child", "web"):
                result = await client.call_tool(f"{server}__confirm", {"question": f"proceed on {server}?"})
                assert result.content[0].text == "accepted: ok=True", result  # type: ignore[union-attr]
            assert asked == ["proceed on mem?", "proceed on child?", "proceed on web?"]


async def test_a_roots_request_from_an_upstream_is_relayed_to_the_client(connect: Connect) -> None:
    async def on_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///projects/alpha", name="alpha")])

    with anyio.fail_after(60), warnings.catch_warnings():
        # Roots are deprecated at 2026-07-28, and still what every 2025-era client offers.
        warnings.simplefilter("ignore", MCPDeprecationWarning)
        async with connect(list_roots_callback=on_roots) as client:
            for server in ("mem", "child", "web"):
                result = await client.call_tool(f"{server}__client_roots", {})
                assert result.content[0].text == "file:///projects/alpha", result  # type: ignore[union-attr]


async def test_log_messages_from_an_upstream_reach_the_client(connect: Connect) -> None:
    received: list[types.LoggingMessageNotificationParams] = []

    async def on_log(params: types.LoggingMessageNotificationParams) -> None:
        received.append(params)

    with anyio.fail_after(60):
        async with connect(logging_callback=on_log, log_level="info") as client:
            for server in ("mem", "child", "web"):
                received.clear()
                assert (await client.call_tool(f"{server}__log_line", {"message": f"hi from {server}"})).content
                assert [(p.level, p.data, p.logger) for p in received] == [
                    ("info", f"hi from {server}", f"{server}/demo-logger")
                ]


async def test_a_cancelled_call_is_cancelled_at_the_upstream_too(connect: Connect, tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            for server in ("child", "web"):
                marker = tmp_path / f"{server}.cancelled"
                async with anyio.create_task_group() as tg:
                    tg.start_soon(client.call_tool, f"{server}__wait_for_cancel", {"marker": str(marker)})
                    while not Path(f"{marker}.started").exists():  # the upstream runs the call: cancel it
                        await anyio.sleep(0.05)
                    tg.cancel_scope.cancel()
                with anyio.fail_after(10):
                    # the upstream writes it when its handler is cancelled (created, then written: wait for both)
                    while not marker.exists() or not marker.read_text():
                        await anyio.sleep(0.05)
                assert marker.read_text() == "cancelled"
                result = await client.call_tool(f"{server}__echo", {"text": "still fine"})
                assert result.content[0].text == "still fine"  # type: ignore[union-attr]


async def test_a_prompt_error_of_a_typescript_upstream_keeps_its_code_and_has_no_second_prefix(
    tmp_path: Path,
) -> None:
    command = everything_command()
    config = write_config(tmp_path / "gateway.yaml", f"mcps:\n  every:\n    command: {command}\n    args: [stdio]\n")
    with anyio.fail_after(60):
        async with gateway_over_stdio(config, tmp_path) as client:
            with pytest.raises(MCPError) as raised:
                await client.get_prompt("every__args-prompt", {})
    # The TypeScript server writes "MCP error -32602: " into its message; a TypeScript
    # client adds it again. The gateway passes the code and the server's words only.
    assert raised.value.code == types.INVALID_PARAMS
    assert raised.value.message.startswith("Invalid arguments for prompt args-prompt"), raised.value.message
    assert "MCP error" not in raised.value.message


async def test_a_resource_error_of_an_upstream_names_the_uri_the_client_sent(connect: Connect) -> None:
    with anyio.fail_after(60):
        async with connect() as client:
            for server in ("child", "web"):
                with pytest.raises(MCPError) as raised:
                    await client.read_resource(f"{server}+demo://nope")
                assert raised.value.message == f"Unknown resource: {server}+demo://nope"
                assert raised.value.data == {"uri": f"{server}+demo://nope"}


def test_relayed_error_drops_the_typescript_prefix_and_names_the_exposed_uri() -> None:
    doubled = MCPError(types.INVALID_PARAMS, "MCP error -32602: MCP error -32602: bad city")
    assert (relayed_error(doubled).code, relayed_error(doubled).message) == (types.INVALID_PARAMS, "bad city")
    missing = MCPError(-32002, "Resource demo://x not found", {"uri": "demo://x"})
    renamed = relayed_error(missing, ("demo://x", "web+demo://x"))
    assert (renamed.message, renamed.data) == ("Resource web+demo://x not found", {"uri": "web+demo://x"})
    plain = MCPError(types.INVALID_PARAMS, "MCP error handling is fine here")
    assert relayed_error(plain) is plain
