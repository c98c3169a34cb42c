"""Tool integrity: fingerprints, the store, and vetting against a real hostile upstream (a stdio child)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from gateway.cli.main import run
from gateway.config.loader import parse_config
from gateway.config.security import SecurityConfig
from gateway.config.settings import Settings
from gateway.errors import ERROR_META_KEY
from gateway.registry import Registry
from gateway.security.integrity import IntegrityStore, fingerprint
from gateway.security.vetting import ToolVetter
from gateway.server_specs import specs_from_config
from gateway.serving.server import GatewayServer
from tests.conftest import REPO, write_config
from tests.servers.poisoned_server import HONEST, RUG

pytestmark = pytest.mark.anyio

POISONED = REPO / "tests" / "servers" / "poisoned_server.py"
CONFIG = f"mcps:\n  poisoned: {{command: {sys.executable}, args: ['{POISONED}', stdio]}}\n"


def tool(description: str, schema: dict[str, Any] | None = None) -> types.Tool:
    return types.Tool(name="t", description=description, input_schema=schema or {"type": "object"})


def test_a_fingerprint_covers_description_and_schema_but_not_key_order() -> None:
    base = fingerprint(tool("x", {"type": "object", "properties": {"a": {"type": "string"}}}))
    assert base == fingerprint(tool("x", {"properties": {"a": {"type": "string"}}, "type": "object"}))
    assert base != fingerprint(tool("y", {"type": "object", "properties": {"a": {"type": "string"}}}))
    assert base != fingerprint(tool("x", {"type": "object", "properties": {"a": {"type": "integer"}}}))


def test_the_store_approves_the_first_definition_and_holds_a_change_until_approved(tmp_path: Path) -> None:
    store = IntegrityStore.in_dir(tmp_path)
    assert store.observe("s", "t", "s__t", "one") == "new"
    assert store.observe("s", "t", "s__t", "one") == "same"
    assert store.observe("s", "t", "s__t", "two") == "changed"
    assert [t.pending for t in store.pending()] == ["two"]
    assert not store.is_trusted("s", "t", "two")
    (stored,) = store.find("s__t")
    assert store.find("s/t") == [stored]
    assert store.approve(stored) == "two"
    assert store.is_trusted("s", "t", "two") and store.pending() == []
    assert IntegrityStore.in_dir(tmp_path).observe("s", "t", "s__t", "two") == "same"  # it persists


@asynccontextmanager
async def vetted(tmp_path: Path, **security: Any) -> AsyncIterator[tuple[Client, Registry, ToolVetter]]:
    config = parse_config(CONFIG, tmp_path / "gw.yaml")
    settings = Settings(data_dir=tmp_path / "data")
    registry = Registry(specs_from_config(config), settings)
    policy = SecurityConfig(**security)
    vetter = ToolVetter(IntegrityStore.in_dir(settings.data_dir), policy)
    registry.listing_filter = vetter.vet
    registry.withheld = vetter.withheld
    with anyio.fail_after(60):
        async with registry.running():
            await registry.wait_settled()
            gateway = GatewayServer(registry, settings, security=policy)
            async with Client(gateway.server) as client:
                yield client, registry, vetter


async def descriptions(client: Client) -> dict[str, str]:
    return {t.name: t.description or "" for t in (await client.list_tools()).tools}


async def rug_pull(client: Client, registry: Registry) -> None:
    """Make the upstream change `weather`, and wait until the catalog has been rebuilt."""
    changed = anyio.Event()

    async def on_change(kinds: set[str]) -> None:
        changed.set()

    registry.change_listeners.append(on_change)
    assert not (await client.call_tool("poisoned__rug_pull", {})).is_error
    with anyio.fail_after(20):
        await changed.wait()
    registry.change_listeners.remove(on_change)


async def test_a_tool_that_changes_between_two_list_calls_is_withheld_under_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with vetted(tmp_path, tool_changes="block") as (client, registry, vetter):
        assert (await descriptions(client))["poisoned__weather"] == HONEST
        await rug_pull(client, registry)
        assert "poisoned__weather" not in await descriptions(client)
        report = vetter.reports["poisoned__weather"]
        assert report.changed and report.action == "withheld"

        result = await client.call_tool("poisoned__weather", {"city": "Paris"})
        assert result.is_error and result.meta is not None
        error = result.meta[ERROR_META_KEY]
        assert error["code"] == "tool_withheld" and error["reason"] == "changed"
        text = result.content[0].text  # type: ignore[union-attr]
        assert "withheld" in text and "definition" in text and "changed" in text
        assert error["approve_command"] == "mcp-gateway tools approve poisoned__weather"
        assert f"`{error['approve_command']}`" in text

        # The command the message names is the one that releases the tool.
        monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
        assert run(error["approve_command"].split()[1:]) == 0
        changed = anyio.Event()

        async def on_change(kinds: set[str]) -> None:
            changed.set()

        registry.change_listeners.append(on_change)
        async with anyio.create_task_group() as tg:
            tg.start_soon(vetter.watch, registry.revet, 0.05)
            with anyio.fail_after(20):
                await changed.wait()
            tg.cancel_scope.cancel()
        assert (await descriptions(client))["poisoned__weather"] == RUG
        assert not (await client.call_tool("poisoned__weather", {"city": "Paris"})).is_error


async def test_a_changed_tool_is_flagged_but_listed_under_warn(tmp_path: Path) -> None:
    async with vetted(tmp_path) as (client, registry, vetter):
        await rug_pull(client, registry)
        assert (await descriptions(client))["poisoned__weather"] == RUG
        assert vetter.reports["poisoned__weather"].changed
        assert vetter.reports["poisoned__weather"].action == "listed"


async def test_a_poisoned_description_is_flagged_stripped_or_quarantined(tmp_path: Path) -> None:
    async with vetted(tmp_path / "warn") as (client, _, vetter):
        assert "<IMPORTANT>" in (await descriptions(client))["poisoned__add"]
        assert {f.kind for f in vetter.reports["poisoned__add"].findings} >= {"hidden_block", "secret_access"}
    async with vetted(tmp_path / "strip", injection="strip") as (client, _, _):
        assert (await descriptions(client))["poisoned__add"] == "Add two numbers."
    async with vetted(tmp_path / "quarantine", injection="quarantine") as (client, _, vetter):
        assert "poisoned__add" not in await descriptions(client)
        assert "poisoned__weather" in await descriptions(client)
        assert vetter.reports["poisoned__add"].action == "withheld"
        result = await client.call_tool("poisoned__add", {"a": 1, "b": 2})
        assert result.is_error and result.meta is not None
        assert result.meta[ERROR_META_KEY]["code"] == "tool_withheld"
        assert result.meta[ERROR_META_KEY]["reason"] == "suspicious"
        assert "mcp-gateway tools approve poisoned__add" in result.content[0].text  # type: ignore[union-attr]


async def test_an_approved_quarantined_tool_is_released(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with vetted(tmp_path, injection="quarantine") as (client, _, _):
        assert "poisoned__add" not in await descriptions(client)
    monkeypatch.setenv("GATEWAY_DATA_DIR", str(tmp_path / "data"))
    assert run(["tools", "approve", "poisoned__add"]) == 0
    async with vetted(tmp_path, injection="quarantine") as (client, _, _):
        assert "poisoned__add" in await descriptions(client)


def test_check_shows_the_findings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_config(tmp_path / "gw.yaml", CONFIG)
    assert run(["--config", str(config), "check"]) == 0
    out = capsys.readouterr().out
    assert "poisoned__add (listed):" in out
    assert "hidden_block: '<IMPORTANT>" in out and "secret_access: '~/.ssh" in out
    assert "poisoned__weather" not in out


def test_approving_an_unknown_tool_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["tools", "approve", "nobody__nothing"]) == 2
    assert "no tool 'nobody__nothing' has been seen" in capsys.readouterr().err
