"""The plugins' call hooks: before (change arguments, answer instead), after (replace results),
translate errors — through a real gateway, called by the SDK's client; and `gateway_enrich_tool`,
the text plugins add to the router's documents."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from gateway.config.routing_settings import EmbeddingSettings
from gateway.config.runtime_settings import PluginSettings
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY
from gateway.plugins import get_plugin_manager
from gateway.registry import Registry
from gateway.router.service import RouterService, build_router, records_from_registry
from gateway.server_specs import specs_from_plugins
from gateway.serving.server import GatewayServer
from tests.conftest import FIXTURE_PLUGINS

pytestmark = pytest.mark.anyio

FIRST = """
from gateway.hookspecs import hookimpl

@hookimpl
def gateway_before_call(call):
    if call.original == "echo":
        call.arguments = {"text": call.arguments["text"] + "-first"}

@hookimpl
def gateway_after_call(call, result):
    text = result.content[0].text + "|first"
    return result.model_copy(update={"content": [result.content[0].model_copy(update={"text": text})]})
"""

SECOND = """
import mcp_types as types
from gateway.hookspecs import hookimpl

@hookimpl
async def gateway_before_call(call):
    if call.original == "echo":
        call.arguments = {"text": call.arguments["text"] + "-second"}
    if call.original == "fail":
        answer = "answered by second"  # `fail` declares an output schema: structured content is due too
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=answer)], structuredContent={"result": answer}
        )

@hookimpl
async def gateway_after_call(call, result):
    text = result.content[0].text + "|second"
    return result.model_copy(update={"content": [result.content[0].model_copy(update={"text": text})]})

@hookimpl
def gateway_translate_error(call, error):
    if error.code == "invalid_arguments":
        return types.CallToolResult(
            content=[types.TextContent(type="text", text=f"Oops ({error.code}) calling {call.name}")], isError=True
        )
"""

BROKEN = """
from gateway.hookspecs import hookimpl

@hookimpl
def gateway_before_call(call):
    if call.original == "add":
        raise RuntimeError("the plugin has a bug")
"""


async def _call(tmp_path: Path, plugins: dict[str, str], tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
    directory = tmp_path / "plugins"
    shutil.copytree(FIXTURE_PLUGINS / "memdemo", directory / "memdemo")
    for name, code in plugins.items():
        (directory / name).mkdir()
        (directory / name / "__init__.py").write_text(textwrap.dedent(code))
    settings = Settings(data_dir=tmp_path / "data", plugins=PluginSettings(directory=directory, entry_points=False))
    pm, infos = get_plugin_manager(settings)
    assert all(info.status == "loaded" for info in infos), infos
    registry = Registry(specs_from_plugins(pm, settings), settings, plugins=pm)
    with anyio.fail_after(30):
        async with registry.running():
            await registry.wait_settled(20)
            async with Client(GatewayServer(registry, settings).server) as client:
                return await client.call_tool(tool, arguments)


def _text(result: types.CallToolResult) -> str:
    assert isinstance(result.content[0], types.TextContent)
    return result.content[0].text


async def test_before_hooks_run_in_plugin_order_and_after_hooks_in_reverse(tmp_path: Path) -> None:
    result = await _call(tmp_path, {"a_first": FIRST, "b_second": SECOND}, "mem__echo", {"text": "x"})
    assert _text(result) == "x-first-second|second|first"


async def test_a_before_hook_may_answer_instead_of_the_upstream(tmp_path: Path) -> None:
    result = await _call(tmp_path, {"a_first": FIRST, "b_second": SECOND}, "mem__fail", {"message": "boom"})
    assert not result.is_error and _text(result) == "answered by second|second|first"


async def test_a_plugin_may_translate_a_gateway_error(tmp_path: Path) -> None:
    result = await _call(tmp_path, {"b_second": SECOND}, "mem__add", {"a": "one", "b": 2})
    assert result.is_error and _text(result) == "Oops (invalid_arguments) calling mem__add"


async def test_without_a_translation_the_standard_error_result_is_sent(tmp_path: Path) -> None:
    result = await _call(tmp_path, {"a_first": FIRST}, "mem__add", {"a": "one", "b": 2})
    assert result.is_error and result.meta is not None
    assert result.meta[ERROR_META_KEY]["code"] == "invalid_arguments"


async def test_a_failing_hook_is_an_execution_error_naming_the_plugin(tmp_path: Path) -> None:
    result = await _call(tmp_path, {"broken": BROKEN}, "mem__add", {"a": 1, "b": 2})
    assert result.is_error and result.meta is not None
    assert result.meta[ERROR_META_KEY]["code"] == "execution_error"
    assert _text(result) == "Plugin 'broken' failed in gateway_before_call: RuntimeError: the plugin has a bug"


ENRICHER = """
from gateway.hookspecs import hookimpl

@hookimpl
def gateway_enrich_tool(tool, server_id):
    if tool.name == "mem__sleep":
        return ["siesta nap doze", "snooze"]
    if tool.name == "mem__add":
        raise RuntimeError("a buggy enricher")
    return None
"""


async def test_enrichment_from_a_plugin_is_indexed_and_a_failing_one_is_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "plugins"
    shutil.copytree(FIXTURE_PLUGINS / "memdemo", directory / "memdemo")
    (directory / "enricher").mkdir()
    (directory / "enricher" / "__init__.py").write_text(textwrap.dedent(ENRICHER))
    settings = Settings(
        data_dir=tmp_path / "data",
        plugins=PluginSettings(directory=directory, entry_points=False),
        embedding=EmbeddingSettings(enabled=False),  # keyword search alone: the added words must match
    )
    pm, _ = get_plugin_manager(settings)
    registry = Registry(specs_from_plugins(pm, settings), settings, plugins=pm)
    with anyio.fail_after(30):
        async with registry.running():
            await registry.wait_settled(20)
            records = {r.name: r for r in records_from_registry(registry)}
            assert records["mem__sleep"].extra == ("siesta nap doze", "snooze")
            assert records["mem__add"].extra == () and records["mem__echo"].extra == ()
            router = RouterService(registry, settings, lambda: build_router(settings, pm))
            registry.task_group.start_soon(router.run)
            await router.complete.wait()
            hits = await router.search("a short siesta", 3, 0.0)
            assert hits[0].name == "mem__sleep"


def _translator(tag: str) -> str:
    """A plugin that translates every gateway-made error, and records whether its after-hook ran."""
    return f"""
import mcp_types as types
from gateway.hookspecs import hookimpl

@hookimpl
def gateway_after_call(call, result):
    text = result.content[0].text + "|after {tag}"
    return result.model_copy(update={{"content": [types.TextContent(type="text", text=text)]}})

@hookimpl
def gateway_translate_error(call, error):
    return types.CallToolResult(content=[types.TextContent(type="text", text="{tag}: " + error.code)], isError=True)
"""


async def test_the_first_plugin_in_plugin_order_translates_an_error_as_it_runs_first_before_a_call(
    tmp_path: Path,
) -> None:
    """`a_first` runs first in gateway_before_call, so it is also the one whose translation wins."""
    result = await _call(
        tmp_path,
        {"a_first": _translator("a_first"), "z_last": _translator("z_last")},
        "mem__add",
        {
            "a": "one",
            "b": 2,
        },
    )
    assert result.is_error and _text(result) == "a_first: invalid_arguments"


async def test_after_hooks_see_upstream_error_results_but_not_gateway_made_errors(tmp_path: Path) -> None:
    """An upstream's own error result goes through the after-hooks; a gateway-made error (here, invalid
    arguments) goes to gateway_translate_error only."""
    upstream_error = await _call(tmp_path / "one", {"a_first": _translator("a")}, "mem__fail", {"message": "boom"})
    assert upstream_error.is_error and _text(upstream_error).endswith("|after a")
    gateway_error = await _call(tmp_path / "two", {"a_first": _translator("a")}, "mem__add", {"a": "one", "b": 2})
    assert _text(gateway_error) == "a: invalid_arguments"
