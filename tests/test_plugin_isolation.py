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
        async def block(seconds: float) -> str:
            \"\"\"Hold the event loop (a plugin bug: time.sleep in an async tool).\"\"\"
            time.sleep(seconds)
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


def test_the_watchdog_names_the_plugin_function_holding_the_loop_within_a_second() -> None:
    """In process: a function of a module that belongs to plugin `hazard` sleeps on the loop for 3 s;
    the watchdog's report arrives while it still sleeps, less than a second into it."""
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

    async def main() -> float:
        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watchdog.watch)
                await anyio.sleep(0.2)
                started = time.monotonic()
                module.block(3)
                ended = time.monotonic()
                tg.cancel_scope.cancel()
        assert reported.is_set()
        [(stall, at)] = stalls
        assert at < ended, "reported while the loop was still held"
        return at - started

    delay = anyio.run(main)
    [(stall, _)] = stalls
    assert (stall.plugin, stall.function) == ("hazard", "block")
    assert stall.describe().startswith("plugin 'hazard', in block() at ")
    assert delay < 1.0, delay


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

    async def main() -> tuple[float, float, bool, str]:
        from mcp import Client

        quick_done = anyio.Event()
        outcome: dict[str, object] = {}

        async def slow(client: Client) -> None:
            started = time.monotonic()
            result = await client.call_tool("hazard__block", {"seconds": 8})
            outcome.update(seconds=time.monotonic() - started, meta=result.meta, is_error=result.is_error)
            outcome["quick_first"] = quick_done.is_set()

        with anyio.fail_after(90):
            async with gateway_over_stdio(config, tmp_path, _env(tmp_path)) as client:
                await client.call_tool("hazard__block", {"seconds": 0})  # the child is up
                async with anyio.create_task_group() as tg:
                    tg.start_soon(slow, client)
                    await anyio.sleep(0.3)  # the slow call is in the child by now
                    started = time.monotonic()
                    quick = await client.call_tool("good__hello", {"who": "Ada"})
                    quick_seconds = time.monotonic() - started
                    assert quick.content[0].text == "hello Ada"  # type: ignore[union-attr]
                    quick_done.set()
        assert outcome["quick_first"] is True
        return quick_seconds, float(outcome["seconds"]), bool(outcome["is_error"]), json.dumps(outcome["meta"])

    quick_seconds, slow_seconds, is_error, meta = anyio.run(main)
    assert is_error and "upstream_timeout" in meta
    assert slow_seconds < 7, "the 2 s timeout fired before the 8 s block ended"
    assert quick_seconds < 2, "the concurrent call did not wait for the blocked plugin"
