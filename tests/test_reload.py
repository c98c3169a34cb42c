"""Live reload and runtime server control, with real upstreams.

In process: a `Registry` with in-memory and stdio demo servers, restarted, disabled, enabled
and given new specs while it serves. As a process: `mcp-gateway serve` over HTTP with stdio
children and a real SDK client, while the test edits its YAML file or sends it SIGHUP.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from watchfiles import awatch

from gateway.config.loader import load_config
from gateway.config.runtime_settings import PluginSettings
from gateway.config.settings import Settings
from gateway.errors import GatewayError, UpstreamUnavailable
from gateway.plugins import get_plugin_manager
from gateway.registry import OPERATOR_DISABLED, Registry, UnknownServer
from gateway.security.integrity import IntegrityStore
from gateway.security.vetting import ToolVetter
from gateway.server_specs import RegistrationError, specs_from_config
from gateway.serving.reload import Reloader, ReloadReport, changed_settings
from gateway.upstreams.supervision import SpecChanges, diff_specs, same_spec
from gateway.upstreams.upstream import UpstreamSpec
from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    gateway_over_stdio,
    start_gateway_http,
    start_script_http,
    stop_process,
)
from tests.servers.demo_server import create_server

pytestmark = pytest.mark.anyio

TINY_SERVER = REPO / "tests" / "servers" / "tiny_server.py"
ALL_TOOLS = {"GATEWAY_ROUTING__MODE": "all", "GATEWAY_RECORDS__ENABLED": "false"}
"""A gateway child that lists every tool (two demo servers pass `auto`'s limit) and records nothing."""


# ---- in process: the registry ---------------------------------------------------------


def memory(name: str) -> UpstreamSpec:
    return UpstreamSpec(id=name, prefix=name, transport="memory", target=create_server(name))


def stdio_demo(name: str, **env: str) -> UpstreamSpec:
    target = StdioServerParameters(
        command=sys.executable, args=[str(DEMO_SERVER), "stdio", "--name", name], env=env or None
    )
    return UpstreamSpec(id=name, prefix=name, transport="stdio", target=target)


def settings_for(tmp_path: Path) -> Settings:
    return Settings(config=tmp_path / "gateway.yaml", data_dir=tmp_path / "data")


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def pid_of(registry: Registry, server: str) -> int:
    return int(text(await registry.call_tool(f"{server}__pid", {})))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@asynccontextmanager
async def running(specs: list[UpstreamSpec], tmp_path: Path) -> AsyncIterator[tuple[Registry, list[set[str]]]]:
    """A running registry whose servers have all connected, and the list changes it told."""
    registry = Registry(specs, settings_for(tmp_path))
    told: list[set[str]] = []

    async def listener(kinds: set[str]) -> None:
        told.append(kinds)

    registry.change_listeners.append(listener)
    async with registry.running():
        await registry.wait_settled(30)
        yield registry, told


async def until_tool(registry: Registry, name: str, present: bool = True) -> None:
    """Wait until the catalog has (or no longer has) the tool: on each state change, look again."""
    while (name in registry.catalog.tools) != present:
        changed = anyio.Event()

        async def wake(_kinds: set[str], changed: anyio.Event = changed) -> None:
            changed.set()

        registry.change_listeners.append(wake)
        try:
            await changed.wait()
        finally:
            registry.change_listeners.remove(wake)


async def test_restarting_a_server_replaces_its_process_while_the_others_keep_serving(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with running([stdio_demo("a"), memory("b")], tmp_path) as (registry, _):
            before = await pid_of(registry, "a")
            answers: list[str] = []

            async def slow_call() -> None:
                answers.append(text(await registry.call_tool("b__sleep", {"seconds": 1.0})))

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_call)
                await registry.restart_server("a")
                assert not alive(before), "the old child was not reaped"
                assert text(await registry.call_tool("b__echo", {"text": "still here"})) == "still here"
            assert answers == ["slept 1.0"]
            after = await pid_of(registry, "a")  # waits for the new session
            assert after != before
            assert registry.upstreams["a"].state == "ready"


async def test_an_unknown_server_is_a_key_error_naming_the_servers(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with running([memory("a")], tmp_path) as (registry, _):
            with pytest.raises(KeyError) as raised:
                await registry.restart_server("nope")
            assert raised.value.args == ("nope",)
            assert isinstance(raised.value, UnknownServer)
            assert str(raised.value) == "no server 'nope'; servers: a"
            with pytest.raises(UnknownServer):
                await registry.set_server_enabled("nope", False)


async def test_a_disabled_server_leaves_the_catalog_and_comes_back_when_enabled(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with running([memory("a"), memory("b")], tmp_path) as (registry, told):
            assert "a__echo" in registry.catalog.tools
            told.clear()
            await registry.set_server_enabled("a", False)
            upstream = registry.upstreams["a"]
            assert (upstream.state, upstream.reason) == ("disabled", OPERATOR_DISABLED)
            assert not [name for name in registry.catalog.tools if name.startswith("a__")]
            assert "b__echo" in registry.catalog.tools
            assert told == [{"tools", "prompts", "resources"}]  # told once
            with pytest.raises(UpstreamUnavailable, match=r"Server 'a' is not available \(disabled: disabled by an"):
                await registry.call_tool("a__echo", {"text": "hi"})
            await registry.set_server_enabled("a", False)  # again: nothing to do

            await registry.set_server_enabled("a", True)
            await until_tool(registry, "a__echo")
            assert text(await registry.call_tool("a__echo", {"text": "back"})) == "back"
            assert registry.upstreams["a"].state == "ready"


async def test_a_restart_of_a_disabled_server_is_refused_with_the_reason(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with running([memory("a")], tmp_path) as (registry, _):
            await registry.set_server_enabled("a", False)
            with pytest.raises(ValueError, match="server 'a' is disabled .*enable it"):
                await registry.restart_server("a")


async def test_applying_specs_keeps_unchanged_servers_and_replaces_changed_ones(tmp_path: Path) -> None:
    keep, change, drop = memory("keep"), stdio_demo("change"), memory("drop")
    with anyio.fail_after(60):
        async with running([keep, change, drop], tmp_path) as (registry, told):
            kept = registry.upstreams["keep"]
            old_pid = await pid_of(registry, "change")
            await registry.call_tool("drop__echo", {"text": "x"})
            assert 'server="drop"' in registry.metrics.exposition().decode()
            told.clear()
            specs = [keep, stdio_demo("change", DEMO_FLAVOUR="new"), memory("new")]
            changes = await registry.apply_specs(specs, drain_seconds=5)
            assert changes == SpecChanges(added=("new",), removed=("drop",), changed=("change",), unchanged=("keep",))
            assert registry.upstreams["keep"] is kept
            assert list(registry.upstreams) == ["keep", "change", "new"]
            assert not [name for name in registry.catalog.tools if name.startswith("drop__")]
            assert 'server="drop"' not in registry.metrics.exposition().decode()  # its series are gone
            assert told[0] >= {"tools"}  # the removal, at once; the new servers when they are ready
            await until_tool(registry, "new__echo")
            new_pid = await pid_of(registry, "change")
            assert new_pid != old_pid
            with pytest.raises(Exception, match="no tool named 'drop__echo'"):
                await registry.call_tool("drop__echo", {"text": "x"})
            with pytest.raises(RegistrationError, match="used twice"):
                await registry.apply_specs([keep, memory("keep")], drain_seconds=1)
            assert registry.upstreams["keep"] is kept


async def test_a_removed_server_lets_its_calls_finish_within_the_drain_time(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with running([memory("a"), memory("b")], tmp_path) as (registry, _):
            outcomes: dict[str, str] = {}

            async def call(key: str, seconds: float) -> None:
                try:
                    outcomes[key] = text(await registry.call_tool("b__sleep", {"seconds": seconds}))
                except GatewayError as exc:
                    outcomes[key] = f"error: {exc.details.get('cause')}"

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "short", 0.5)
                tg.start_soon(call, "long", 20.0)
                while registry.upstreams["b"].requests.count < 2:
                    await anyio.wait_all_tasks_blocked()
                await registry.apply_specs([registry.specs["a"]], drain_seconds=2)
            assert outcomes["short"] == "slept 0.5"
            assert outcomes["long"].startswith("error: Server 'b' stopped while tools/call 'b__sleep' ran")
            assert "it was removed from the configuration, and its calls had 2 s to finish" in outcomes["long"]
            assert "b" not in registry.upstreams


async def test_callers_sessions_of_a_restarted_or_changed_server_are_closed_and_made_again(tmp_path: Path) -> None:
    recorder, url = start_script_http([str(REPO / "tests" / "servers" / "poisoned_server.py"), "http"])
    fwd = UpstreamSpec(id="fwd", prefix="fwd", transport="http", target=url, forward_caller_token=True)

    async def seen_authorization(registry: Registry) -> str:
        # The recorder answers with the last request it got: the shared session must be done connecting.
        await registry.upstreams["fwd"].wait_settled()
        result = await registry.call_tool("fwd__seen_headers", {}, caller_token="caller-token-1")
        return str(json.loads(text(result)).get("authorization"))

    try:
        with anyio.fail_after(60):
            async with running([fwd], tmp_path) as (registry, _):
                assert await seen_authorization(registry) == "Bearer caller-token-1"
                assert len(registry.caller_sessions) == 1
                await registry.restart_server("fwd")
                assert len(registry.caller_sessions) == 0  # closed with the server's session
                assert await seen_authorization(registry) == "Bearer caller-token-1"
                assert len(registry.caller_sessions) == 1
                await registry.apply_specs([dataclasses.replace(fwd, timeout=20)], drain_seconds=5)
                assert len(registry.caller_sessions) == 0  # the next one is made with the new spec
                assert await seen_authorization(registry) == "Bearer caller-token-1"
                [session] = registry.caller_sessions.retire("fwd")
                assert session.spec.timeout == 20
                session.stop()
    finally:
        stop_process(recorder)


# ---- in process: the reloader ---------------------------------------------------------


@asynccontextmanager
async def reloading(
    tmp_path: Path, body: str, settings_source: Any = None
) -> AsyncIterator[tuple[Reloader, Registry, Path]]:
    """A running registry made from a config file of tiny stdio servers, and its reloader."""
    path = tmp_path / "gateway.yaml"
    path.write_text(body)
    settings = Settings(
        config=path,
        data_dir=tmp_path / "data",
        plugins=PluginSettings(entry_points=False, directory=tmp_path / "no-plugins"),
    )
    config = load_config(path)
    pm, _ = get_plugin_manager(settings)
    registry = Registry(specs_from_config(config), settings, plugins=pm)
    vetter = ToolVetter(IntegrityStore.in_dir(settings.data_dir), config.security)
    registry.listing_filter = vetter.vet
    async with registry.running():
        await registry.wait_settled(30)
        yield Reloader(registry, settings, pm, config, vetter, settings_source=settings_source), registry, path


async def test_a_reload_reports_what_changed_and_a_broken_file_is_refused_with_its_line(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with reloading(tmp_path, "mcps:\n" + tiny("one")) as (reloader, registry, path):
            one = registry.upstreams["one"]
            assert await reloader.reload_if_changed("watch") is None  # the file is as it was
            path.write_text("mcps:\n" + tiny("one") + tiny("two"))
            report = await reloader.reload("api")
            assert (report.ok, report.trigger, report.error) == (True, "api", None)
            assert (report.added, report.removed, report.changed, report.unchanged) == (("two",), (), (), ("one",))
            assert registry.upstreams["one"] is one
            await until_tool(registry, "two__echo")

            path.write_text("mcps:\n" + tiny("one") + "  two: [\n")
            refused = await reloader.reload("sighup")
            assert not refused.ok
            assert refused.error is not None and refused.error.startswith(f"{path}:")
            assert list(registry.specs) == ["one", "two"]  # nothing was touched
            assert text(await registry.call_tool("two__echo", {"text": "still"})) == "still"

            path.write_text("mcps:\n" + tiny("one") + "  two:\n    command: x\n    colour: red\n")
            refused = await reloader.reload("api")
            assert refused.error is not None and "mcps.two.colour: unknown key 'colour'" in refused.error
            assert refused.error.startswith(f"{path}:")
            assert reloader.history[0] is report
            assert reloader.last is refused and len(reloader.history) == 3
            assert json.loads(json.dumps(refused.as_dict()))["ok"] is False


async def test_reloads_at_the_same_time_run_one_after_the_other(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with reloading(tmp_path, "mcps:\n" + tiny("one")) as (reloader, registry, path):
            path.write_text("mcps:\n" + tiny("one") + tiny("two"))
            reports: list[ReloadReport] = []

            async def reload(trigger: str) -> None:
                reports.append(await reloader.reload(trigger))

            async with anyio.create_task_group() as tg:
                tg.start_soon(reload, "watch")
                tg.start_soon(reload, "sighup")
            assert [r.added for r in reports] == [("two",), ()]  # the second saw the first one's result
            assert reports[1].unchanged == ("one", "two")
            assert list(registry.upstreams) == ["one", "two"]


async def test_what_cannot_change_live_is_reported_as_needing_a_restart(tmp_path: Path) -> None:
    changed_env: list[Settings] = []

    def settings_source() -> Settings:
        return changed_env[0] if changed_env else reloader.settings

    with anyio.fail_after(60):
        async with reloading(tmp_path, "mcps:\n" + tiny("one"), settings_source) as (reloader, registry, path):
            key_hash = "sha256:" + "0" * 64
            auth = f"auth:\n  api_keys:\n    - name: ops\n      hash: '{key_hash}'\n"
            path.write_text("mcps:\n" + tiny("one") + auth)
            report = await reloader.reload("api")
            assert report.ok and report.needs_restart == ("auth",)

            # security.injection applies live; its limits do not; a GATEWAY_* setting does not
            changed_env.append(reloader.settings.model_copy(update={"call_timeout": 5.0}))
            security = "security:\n  injection: quarantine\n  limits:\n    max_argument_bytes: 2048\n"
            path.write_text("mcps:\n" + tiny("one") + auth + security)
            report = await reloader.reload("api")
            assert report.ok
            assert report.needs_restart == ("auth", "security.limits", "GATEWAY_CALL_TIMEOUT")
            assert reloader.vetter is not None and reloader.vetter.config.injection == "quarantine"
            assert report.unchanged == ("one",)


def test_specs_compare_by_value_tool_filters_included(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(f"mcps:\n  a:\n    command: {sys.executable}\n    tools:\n      deny: [fail]\n")
    first, second = specs_from_config(load_config(config)), specs_from_config(load_config(config))
    assert same_spec(first[0], second[0])
    assert not same_spec(first[0], dataclasses.replace(second[0], timeout=3))
    changes = diff_specs({"a": first[0]}, second)
    assert changes.unchanged == ("a",)


def test_a_report_is_json_and_names_changed_settings() -> None:
    report = ReloadReport(ok=True, trigger="api", at=1.0, added=("x",), needs_restart=("auth",))
    assert json.loads(json.dumps(report.as_dict()))["added"] == ["x"]
    old = Settings()
    new = old.model_copy(update={"http": old.http.model_copy(update={"port": 9}), "call_timeout": 5.0})
    assert changed_settings(old, new) == ["GATEWAY_CALL_TIMEOUT", "GATEWAY_HTTP__PORT"]


# ---- as a process: mcp-gateway serve, its YAML edited -------------------------------------


def demo(name: str, *extra: str) -> str:
    args = json.dumps([str(DEMO_SERVER), "stdio", "--name", name, *extra])
    return f"  {name}:\n    command: {sys.executable}\n    args: {args}\n"


def tiny(name: str) -> str:
    return f"  {name}:\n    command: {sys.executable}\n    args: {json.dumps([str(TINY_SERVER)])}\n"


def save(path: Path, body: str) -> None:
    """Save as many editors do: write a new file, then rename it over the old one."""
    fresh = path.with_name(path.name + ".tmp")
    fresh.write_text(body)
    os.replace(fresh, path)


class Log:
    """The gateway's stderr, copied to a file by the reader thread; read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def wait_for(self, text: str, after: int = 0) -> str:
        """The log from offset `after` once it contains `text` (looked at again as the file changes)."""

        def is_log(_change: object, changed: str) -> bool:
            return Path(changed) == self.path

        content = self.path.read_text()
        if text in content[after:]:
            return content[after:]
        # `yield_on_timeout`: a look every half second too, for a write made before the watch began
        async for _ in awatch(
            self.path.parent, watch_filter=is_log, debounce=50, rust_timeout=500, yield_on_timeout=True
        ):
            content = self.path.read_text()
            if text in content[after:]:
                return content[after:]
        raise AssertionError("the log watch ended")

    def size(self) -> int:
        return len(self.path.read_text()) if self.path.exists() else 0


@pytest.fixture
def gateway_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path, Log]]:
    config = tmp_path / "gateway.yaml"
    config.write_text("mcps:\n" + demo("a") + demo("b"))
    log = Log(tmp_path / "gateway.log")
    env = NO_EMBEDDINGS | ALL_TOOLS | {"GATEWAY_RELOAD__DEBOUNCE_SECONDS": "0.1"}
    process, url = start_gateway_http(config, tmp_path, env, log=log.path)
    try:
        yield process, url, config, log
    finally:
        stop_process(process)


@asynccontextmanager
async def client_with_changes(url: str | Path, tmp_path: Path | None = None) -> AsyncIterator[tuple[Client, Any]]:
    """A handshake-era client, and a function that waits for a tools/list_changed and re-lists.
    `url`: the gateway's HTTP URL, or a config file to serve over stdio (in `tmp_path`)."""
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        nonlocal changed
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    async def until(predicate: Any) -> set[str]:
        """Re-list on each list_changed until `predicate(names)` holds."""
        nonlocal changed
        while True:
            names = {t.name for t in (await client.list_tools(cache_mode="refresh")).tools}
            if predicate(names):
                return names
            await changed.wait()
            changed = anyio.Event()

    if isinstance(url, Path):
        assert tmp_path is not None
        env = NO_EMBEDDINGS | ALL_TOOLS | {"GATEWAY_RELOAD__DEBOUNCE_SECONDS": "0.1"}
        async with gateway_over_stdio(url, tmp_path, env, mode="legacy", message_handler=on_message) as client:
            yield client, until
        return
    async with Client(url, mode="legacy", message_handler=on_message) as client:
        yield client, until


async def call_text(client: Client, name: str, arguments: dict[str, Any] | None = None) -> str:
    result = await client.call_tool(name, arguments or {})
    assert not result.is_error, result
    return text(result)


async def test_editing_the_yaml_reloads_it_and_calls_in_flight_survive(
    gateway_process: tuple[subprocess.Popen[str], str, Path, Log],
) -> None:
    _, url, config, log = gateway_process
    with anyio.fail_after(120):
        async with client_with_changes(url) as (client, until):
            await until(lambda names: {"a__pid", "b__pid"} <= names)
            a_pid, b_pid = int(await call_text(client, "a__pid")), int(await call_text(client, "b__pid"))
            answers: list[str] = []

            async def slow_call() -> None:
                answers.append(await call_text(client, "b__sleep", {"seconds": 3}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(slow_call)
                await anyio.wait_all_tasks_blocked()  # the call was sent; its answer is awaited
                # a changes (a new argument), b is unchanged, c is added
                save(config, "mcps:\n" + demo("a", "--start-delay", "0") + demo("b") + tiny("c"))
                await until(lambda names: "c__echo" in names)
            assert answers == ["slept 3.0"]  # the call in flight on b completed across the reload
            assert int(await call_text(client, "b__pid")) == b_pid  # b's process is the same
            new_a = int(await call_text(client, "a__pid"))
            assert new_a != a_pid
            assert await call_text(client, "c__echo", {"text": "hello"}) == "hello"

            # a is removed: its tools are gone
            save(config, "mcps:\n" + demo("b") + tiny("c"))
            await until(lambda names: not any(name.startswith("a__") for name in names))

            # broken edits are refused with their file:line:key message; the old config serves
            offset = log.size()
            save(config, "mcps:\n" + demo("b") + "  c: [unclosed\n")
            refused = await log.wait_for("config reload (watch) refused", offset)
            assert f"{config}:" in refused
            assert await call_text(client, "c__echo", {"text": "still"}) == "still"

            offset = log.size()
            save(config, "mcps:\n" + demo("b") + tiny("c") + "    colour: red\n")
            refused = await log.wait_for("config reload (watch) refused", offset)
            assert f"{config}:" in refused and "mcps.c.colour" in refused
            assert await call_text(client, "b__echo", {"text": "still"}) == "still"

            # a changed auth: section is reported as needing a restart
            offset = log.size()
            key_hash = "sha256:" + "0" * 64
            auth = f"auth:\n  api_keys:\n    - name: ops\n      hash: '{key_hash}'\n"
            save(config, "mcps:\n" + demo("b") + tiny("c") + auth)
            warned = await log.wait_for("applies only after a restart", offset)
            assert "changed, but applies only after a restart: auth\n" in warned  # and nothing else
            assert await call_text(client, "b__echo", {"text": "no key needed yet"}) == "no key needed yet"


async def test_sighup_reloads_the_config(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("mcps:\n" + tiny("one") + tiny("two"))
    env = NO_EMBEDDINGS | ALL_TOOLS | {"GATEWAY_RELOAD__WATCH": "false"}
    process, url = start_gateway_http(config, tmp_path, env)
    try:
        with anyio.fail_after(60):
            async with client_with_changes(url) as (client, until):
                await until(lambda names: {"one__echo", "two__echo"} <= names)
                config.write_text("mcps:\n" + tiny("one") + tiny("two") + tiny("three"))
                process.send_signal(signal.SIGHUP)
                await until(lambda names: "three__echo" in names)
                assert await call_text(client, "three__echo", {"text": "hup"}) == "hup"
                assert process.poll() is None  # SIGHUP reloads; it does not stop the gateway
    finally:
        stop_process(process)


async def test_over_stdio_an_edit_of_the_yaml_is_reloaded_too(tmp_path: Path) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("mcps:\n" + tiny("one"))
    with anyio.fail_after(60):
        async with client_with_changes(config, tmp_path) as (client, until):
            await until(lambda names: "one__echo" in names)
            save(config, "mcps:\n" + tiny("two"))
            names = await until(lambda names: "two__echo" in names and "one__echo" not in names)
            assert "two__echo" in names
            assert await call_text(client, "two__echo", {"text": "over stdio"}) == "over stdio"
