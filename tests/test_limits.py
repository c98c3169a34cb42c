"""Limits on tool calls (`gateway.security.limits`): unit checks, and through a gateway in front of the demo server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from gateway.config.runtime_settings import PluginSettings
from gateway.config.security import LimitsConfig, SecurityConfig
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY
from gateway.plugins import get_plugin_manager
from gateway.registry import Registry
from gateway.security.limits import _json_floor, cap_result, check_arguments
from gateway.server_specs import specs_from_plugins
from gateway.serving.server import GatewayServer
from gateway.sizes import json_bytes, json_ceiling
from tests.conftest import FIXTURE_PLUGINS

pytestmark = pytest.mark.anyio


def text_result(*texts: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=t) for t in texts])


def size_of(result: types.CallToolResult) -> int:
    return len(result.model_dump_json(by_alias=True, exclude_none=True).encode())


def test_a_small_result_is_untouched_and_a_large_one_is_cut_with_a_note() -> None:
    limits = LimitsConfig(max_result_bytes=1000)
    small = text_result("hello")
    assert cap_result(small, limits) is small
    big = cap_result(text_result("a" * 300, 'é\n"' * 2000, "never shown"), limits)
    texts = [b.text for b in big.content if isinstance(b, types.TextContent)]
    assert texts[0] == "a" * 300 and texts[1].startswith('é\n"') and len(texts) == 3
    assert "truncated from" in texts[-1] and "max_result_bytes" in texts[-1]
    assert size_of(big) <= 1000


def test_a_results_floor_is_its_json_size_until_a_string_is_long_and_never_more() -> None:
    long = 'say "hi" \\ é\n' * 1000
    for value in ({}, [], {"a": [1, 2.5, None, True], "b": {"c": "d", "e": []}}, ["\u2028", "\ud800", {"": {}}]):
        assert _json_floor(value) == json_bytes(value), value
    with_long = {"content": [{"type": "text", "text": long}], "x": "é" * 5000}
    assert _json_floor(with_long) == json_bytes(with_long) - (json_bytes(long) - len(long) - 2) - 5000
    huge = text_result("x" * 3_000_000)
    cut = cap_result(huge, LimitsConfig(max_result_bytes=1000))
    assert "truncated from at least 3000079 to 1000 bytes" in cut.content[-1].text  # type: ignore[union-attr]
    assert size_of(cut) <= 1000


def test_a_values_ceiling_is_never_under_its_json_size_and_a_result_near_the_limit_is_measured() -> None:
    values: list[Any] = [
        {},
        [],
        "",
        '\x00\x1f"\\ é \u2028 \ud800 😀',
        {"a": [1, -2, 2.5, -1e300, float("inf"), float("-inf"), float("nan"), None, True, False]},
        {1: "int key", False: "bool key", None: "none key", 2.5: "float key"},
        {"content": [{"type": "text", "text": "\x01" * 100}], "isError": False},
        [[[]], {"": {}}, 10**40],
    ]
    for value in values:
        assert json_ceiling(value) >= json_bytes(value), value
    limits = LimitsConfig(max_result_bytes=1000)
    control = text_result("\x01" * 150)  # 900 bytes of escapes: measured, then kept whole
    assert json_ceiling(control.model_dump(by_alias=True, mode="json", exclude_none=True)) > 1000
    assert cap_result(control, limits) is control
    over = cap_result(text_result("\x01" * 200), limits)  # 1200 bytes: cut
    assert size_of(over) <= 1000 and "truncated from" in over.content[-1].text  # type: ignore[union-attr]


def test_arguments_over_the_limit_are_refused_naming_both_sizes() -> None:
    limits = LimitsConfig(max_argument_bytes=100)
    check_arguments({"text": "x" * 50}, limits)
    with pytest.raises(Exception, match=r"arguments are 1\d\d bytes of JSON; the limit is 100"):
        check_arguments({"text": "x" * 100}, limits)


@asynccontextmanager
async def limited(**limits: Any) -> AsyncIterator[Client]:
    settings = Settings(plugins=PluginSettings(directory=FIXTURE_PLUGINS, allow=["memdemo"]))
    pm, _ = get_plugin_manager(settings)
    registry = Registry(specs_from_plugins(pm, settings), settings)
    with anyio.fail_after(30):
        async with registry.running():
            await registry.wait_settled()
            gateway = GatewayServer(registry, settings, security=SecurityConfig(limits=LimitsConfig(**limits)))
            # The handshake era has sessions; a 2026-07-28 client has none (each request stands alone).
            async with Client(gateway.server, mode="legacy") as client:
                yield client


def code(result: types.CallToolResult) -> str | None:
    return (result.meta or {}).get(ERROR_META_KEY, {}).get("code")


async def test_limits_apply_to_calls_through_the_gateway() -> None:
    async with limited(max_argument_bytes=2000, max_result_bytes=1000, max_calls_per_session=3) as client:
        cut = await client.call_tool("mem__echo", {"text": "z" * 1500})  # echo has an output schema
        assert cut.is_error and "truncated from" in cut.content[-1].text  # type: ignore[union-attr]
        assert "structured content was dropped" in cut.content[-1].text  # type: ignore[union-attr]
        too_big = await client.call_tool("mem__echo", {"text": "z" * 3000})
        assert code(too_big) == "invalid_arguments" and "max_argument_bytes" in too_big.content[0].text  # type: ignore[union-attr]
        assert not (await client.call_tool("mem__add", {"a": 1, "b": 2})).is_error
        over = await client.call_tool("mem__add", {"a": 1, "b": 2})
        assert code(over) == "rate_limited" and "max_calls_per_session" in over.content[0].text  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "result",
    [
        types.CallToolResult(content=[]),
        types.CallToolResult(content=[types.TextContent(type="text", text="")]),
        types.CallToolResult(
            content=[types.TextContent(type="text", text='a"\x01\u00e9\U0001f600\n' * 5)] * 3,
            structured_content={"a": [1, 2.5, None, True, "x\n"], "\u00e9": {"k": -1}},
            is_error=True,
            meta={"mcp-gateway/feedback_token": "0" * 32},
        ),
    ],
)
def test_a_plain_results_ceiling_read_from_the_model_is_never_under_its_size(result: types.CallToolResult) -> None:
    from gateway.security.limits import _text_ceiling

    size = json_bytes(result.model_dump(by_alias=True, mode="json", exclude_none=True))
    assert size <= _text_ceiling(result) < 6 * size + 200
    # exactly at the ceiling's edge the result is kept whole; a limit under its size cuts it
    assert cap_result(result, LimitsConfig(max_result_bytes=max(256, size))) is result


def test_a_result_with_other_blocks_or_values_is_measured_not_estimated() -> None:
    from gateway.security.limits import _text_ceiling

    image = types.CallToolResult(content=[types.ImageContent(type="image", data="AAAA", mime_type="image/png")])
    odd = types.CallToolResult(content=[], structured_content={"when": (1, 2)})
    annotated = types.CallToolResult(
        content=[types.TextContent(type="text", text="x", annotations=types.Annotations(priority=1.0))]
    )
    assert all(_text_ceiling(r) == float("inf") for r in (image, odd, annotated))
