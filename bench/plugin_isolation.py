"""What plugin isolation and the event-loop watchdog cost, and what isolation buys.

    python bench/plugin_isolation.py                 # 1000 measured calls per variant
    python bench/plugin_isolation.py --calls 400 --json

One process, one registry serving two copies of one plugin (tool `echo`): `inproc` in memory, as
plugins are by default, and `isolated` with `plugins.isolated.gateway.isolation: process` (a
`python -m gateway.plugin_host` child over stdio). Calls go through `Registry.call_tool`, the whole
call chain.

1. **Isolation cost per call.** After a warm-up, the two variants take turns in blocks of calls;
   printed: the median and p90 of each and the added time (median over blocks of the difference of
   block medians).
2. **Watchdog overhead.** `inproc` calls in turns with and without the watchdog running
   (`LoopWatchdog`, threshold 0.5 s, the defaults `serve` uses): the same figures.
3. **A blocking isolated call.** `isolated__block` sleeps 8 s with `time.sleep` under a 2 s
   timeout; meanwhile 50 `inproc__echo` calls are made one after another. Printed: when the
   blocking call returned (and with what code), and the median and maximum of the concurrent calls.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
from timing import paired_added, percentile, timed  # noqa: E402

from gateway.config.loader import load_config  # noqa: E402
from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.config.runtime_settings import PluginSettings, RecordsSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.errors import GatewayError  # noqa: E402
from gateway.observability.loop_watchdog import LoopWatchdog  # noqa: E402
from gateway.plugins import get_plugin_manager, plugin_of_module  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.server_specs import specs_from_plugins  # noqa: E402

for noisy in ("gateway", "httpx", "mcp"):
    logging.getLogger(noisy).setLevel(logging.ERROR)

PLUGIN = """
import time
from mcp.server import MCPServer
from gateway.hookspecs import hookimpl

@hookimpl
def gateway_register_servers(register):
    server = MCPServer("{name}")

    @server.tool()
    def echo(text: str) -> str:
        \"\"\"Echo the text.\"\"\"
        return text

    @server.tool()
    async def block(seconds: float) -> str:
        \"\"\"Hold the event loop.\"\"\"
        time.sleep(seconds)
        return "woke up"

    register("{name}", server)
"""
BLOCK = 50


def _project(folder: Path) -> Settings:
    for name in ("inproc", "isolated"):
        (folder / "plugins" / name).mkdir(parents=True)
        (folder / "plugins" / name / "__init__.py").write_text(textwrap.dedent(PLUGIN.format(name=name)))
    (folder / "gateway.yaml").write_text(
        "plugins:\n  isolated:\n    gateway:\n      isolation: process\n      timeout: 2\n"
    )
    return Settings(
        config=folder / "gateway.yaml",
        data_dir=folder / "data",
        plugins=PluginSettings(directory=folder / "plugins", entry_points=False),
        embedding=EmbeddingSettings(enabled=False),
        records=RecordsSettings(enabled=False),
    )


def _figures(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_us": statistics.median(ordered), "p90_us": percentile(ordered, 90)}


async def _turns(variants: dict[str, Any], calls: int) -> dict[str, list[float]]:
    """Each variant's per-call µs, the variants taking turns a block at a time, the order alternating."""
    samples: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for index in range(0, calls, BLOCK):
        for name in names if (index // BLOCK) % 2 == 0 else reversed(names):
            samples[name] += await variants[name](BLOCK)
    return samples


async def main(calls: int, warmup: int) -> dict[str, Any]:
    with anyio.fail_after(900), tempfile.TemporaryDirectory() as scratch:
        settings = _project(Path(scratch))
        pm, _ = get_plugin_manager(settings)
        registry = Registry(specs_from_plugins(pm, settings, load_config(settings.config)), settings, plugins=pm)
        async with registry.running():
            await registry.wait_settled(60)

            def caller(tool: str) -> Any:
                async def call() -> None:
                    await registry.call_tool(tool, {"text": "hi"})

                return lambda n: timed(call, n)

            for tool in ("inproc__echo", "isolated__echo"):
                await caller(tool)(warmup)
            isolation = await _turns({"in memory": caller("inproc__echo"), "isolated": caller("isolated__echo")}, calls)

            watchdog = LoopWatchdog(plugin_of_module(pm), lambda stall: None)
            plain = caller("inproc__echo")

            async def watched(n: int) -> list[float]:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(watchdog.watch)
                    await anyio.sleep(0.06)
                    samples = await plain(n)
                    tg.cancel_scope.cancel()
                return samples

            overhead = await _turns({"no watchdog": plain, "watchdog": watched}, calls)

            blocked: dict[str, Any] = {}

            async def block() -> None:
                started = time.perf_counter()
                try:
                    await registry.call_tool("isolated__block", {"seconds": 8})
                    blocked["code"] = None
                except GatewayError as error:  # what the client gets as an error result with this code
                    blocked["code"] = error.code
                blocked["seconds"] = time.perf_counter() - started

            async with anyio.create_task_group() as tg:
                tg.start_soon(block)
                await anyio.sleep(0.3)
                concurrent = await timed(lambda: registry.call_tool("inproc__echo", {"text": "hi"}), 50)
    return {
        "calls": calls,
        "python": platform.python_version(),
        "isolation": {name: _figures(s) for name, s in isolation.items()}
        | {"added_us": paired_added(isolation["isolated"], isolation["in memory"], BLOCK)},
        "watchdog": {name: _figures(s) for name, s in overhead.items()}
        | {"added_us": paired_added(overhead["watchdog"], overhead["no watchdog"], BLOCK)},
        "blocking_call": {
            "returned_after_s": blocked["seconds"],
            "code": blocked["code"],
            "concurrent_median_ms": statistics.median(concurrent) / 1000,
            "concurrent_max_ms": max(concurrent) / 1000,
        },
    }


def _print(found: dict[str, Any]) -> None:
    print(f"Python {found['python']}, {found['calls']} measured calls per variant\n")
    for part in ("isolation", "watchdog"):
        figures = found[part]
        for name, f in figures.items():
            if name != "added_us":
                print(f"  {part:9} {name:12} median {f['median_us']:8.1f} µs   p90 {f['p90_us']:8.1f} µs")
        print(f"  {part:9} added per call (paired): {figures['added_us']:+.1f} µs\n")
    b = found["blocking_call"]
    print(f"  isolated 8 s blocking call under a 2 s timeout: returned after {b['returned_after_s']:.2f} s")
    print(f"    error code: {b['code']}")
    median, most = b["concurrent_median_ms"], b["concurrent_max_ms"]
    print(f"  50 concurrent in-memory calls meanwhile: median {median:.2f} ms, max {most:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = anyio.run(main, args.calls, args.warmup)
    print(json.dumps(result, indent=2, default=str) if args.json else "", end="")
    if not args.json:
        _print(result)
