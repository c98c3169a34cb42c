"""A plugin cannot stall the others unseen: the event-loop watchdog names the plugin function that
holds the loop (logged, counted in /metrics), and `isolation: process` serves a plugin from a child
of its own, whose blocking tool times out at its limit while other calls are served at once."""

from __future__ import annotations

import json
import re
import textwrap
import threading
import time
from pathlib import Path
from types import ModuleType

import anyio
import httpx

from gateway.observability.loop_watchdog import LoopWatchdog, Stall
from tests.conftest import gateway_over_stdio, start_gateway_http, stop_process, write_config
from tests.test_plugin_failures import GOOD

HAZARD = """
    import time
    from mcp.server import MCPServer
    from gateway.hookspecs import hookimpl

    @hookimpl
    def gateway_register_servers(register):
        server = MCPServer("hazard")

        @server.tool()
        async def block(seconds: float, woke: str = "") -> str:  # holds the loop (a bug: time.sleep in async)
            open(f"{woke}.started", "w").close() if woke else None  # and touches `woke` when it wakes
            time.sleep(seconds)
            if woke:
                open(woke, "w").close()
            return "woke up"

        register("hazard", server)
"""


def _plugins(tmp_path: Path) -> Path:
    for name, body in {"hazard": HAZARD, "good": GOOD}.items():
        (tmp_path / "plugins" / name).mkdir(parents=True)
        (tmp_path / "plugins" / name / "__init__.py").write_text(textwrap.dedent(body))
    return tmp_path / "plugins"


def _env(tmp_path: Path) -> dict[str, str]:
    return {
        "GATEWAY_PLUGINS__DIRECTORY": str(_plugins(tmp_path)),
        "GATEWAY_EMBEDDING__ENABLED": "false",
        "GATEWAY_LOG_LEVEL": "WARNING",
    }


def test_the_watchdog_names_the_plugin_function_while_it_holds_the_loop() -> None:
    """In process: a function of a module that belongs to plugin `hazard` sleeps on the loop for 3 s
    (the watchdog's threshold is 0.3 s); the watchdog's report arrives while it still sleeps. (How
    soon is no test's business on a loaded machine.)"""
    module = ModuleType("mcp_gateway_local_plugins.hazard")
    exec(  # a function whose frame says it is plugin code, as an imported plugin's would
        "import time\ndef block(seconds):\n    time.sleep(seconds)\n", module.__dict__
    )
    stalls: list[tuple[Stall, float]] = []
    reported = threading.Event()

    def on_stall(stall: Stall) -> None:
        stalls.append((stall, time.monotonic()))
        reported.set()

    def plugin_of(name: str) -> str | None:
        return "hazard" if name.startswith("mcp_gateway_local_plugins.hazard") else None

    watchdog = LoopWatchdog(plugin_of, on_stall, threshold=0.3)

    async def main() -> None:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watchdog.watch)
                await anyio.sleep(0.2)
                module.block(3)
                ended = time.monotonic()
                tg.cancel_scope.cancel()
        assert reported.is_set()
        [(stall, at)] = stalls
        assert at < ended, "reported while the loop was still held"

    anyio.run(main)
    [(stall, _)] = stalls
    assert (stall.plugin, stall.function) == ("hazard", "block")
    assert stall.describe().startswith("plugin 'hazard', in block() at ")


def test_a_served_gateway_logs_and_counts_a_stall_naming_the_plugin_and_goes_on_serving(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    log = tmp_path / "gateway.log"
    process, url = start_gateway_http(config, tmp_path, _env(tmp_path), log=log)
    try:

        async def main() -> tuple[str, str]:
            from mcp import Client

            with anyio.fail_after(60):
                async with Client(url) as client:
                    blocked = await client.call_tool("hazard__block", {"seconds": 2})
                    after = await client.call_tool("good__hello", {"who": "Ada"})
                    return blocked.content[0].text, after.content[0].text  # type: ignore[union-attr]

        assert anyio.run(main) == ("woke up", "hello Ada")
        metrics = httpx.get(url.removesuffix("/mcp") + "/metrics", timeout=30).text
        assert 'mcp_gateway_event_loop_stalls_total{plugin="hazard"} 1.0' in metrics
    finally:
        stop_process(process)
    text = log.read_text()
    assert re.search(r"event loop held for \d\.\d s by plugin 'hazard', in block\(\) at .*hazard/__init__\.py:13", text)
    assert "event loop: free again after" in text


def test_an_isolated_plugins_blocking_call_times_out_at_its_limit_while_other_calls_are_served(
    tmp_path: Path,
) -> None:
    """The isolated plugin's tool blocks its child for 60 s; its limit is 2 s. The call's timeout
    comes, and another plugin's call is answered, while the child still blocks (the tool touches
    `woke` when it wakes): neither waited for the block, however slowly the machine runs."""
    config = write_config(
        tmp_path / "gateway.yaml",
        """
        plugins:
          hazard:
            gateway:
              isolation: process
              timeout: 2
        """,
    )
    woke = tmp_path / "woke"

    async def main() -> None:
        from mcp import Client

        async def slow(client: Client) -> None:
            result = await client.call_tool("hazard__block", {"seconds": 60, "woke": str(woke)})
            assert not woke.exists(), "the timeout came only once the block ended"
            assert result.is_error and "upstream_timeout" in json.dumps(result.meta), result

        with anyio.fail_after(120):
            async with gateway_over_stdio(config, tmp_path, _env(tmp_path)) as client:
                await client.call_tool("hazard__block", {"seconds": 0})  # the child is up
                async with anyio.create_task_group() as tg:
                    tg.start_soon(slow, client)
                    while not Path(f"{woke}.started").exists():  # the child blocks now
                        await anyio.sleep(0.05)
                    quick = await client.call_tool("good__hello", {"who": "Ada"})
                    assert not woke.exists(), "the concurrent call waited for the blocked plugin"
                    assert quick.content[0].text == "hello Ada"  # type: ignore[union-attr]

    anyio.run(main)
