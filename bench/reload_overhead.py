"""What live reload costs: the per-request bookkeeping it added, and how long a reload takes.

1. Per request: `Upstream.request` now counts the requests in flight and runs each in a cancel
   scope (so a removed server can drain, then cancel them). Measured against `before` (the
   wrapper as it was: the on-demand counters around `Upstream._send`) and `_send` alone, on an
   in-memory demo server (tool `echo`), in turns of blocks: the paired difference of medians
   is what the bookkeeping added.
2. Per reload: `Registry.apply_specs` with N in-memory servers, when nothing changed (the diff
   and one catalog rebuild) and when one server changed (until its tools are back in the catalog).

    python bench/reload_overhead.py                 # 20000 calls per variant, 20 servers
    python bench/reload_overhead.py --calls 5000 --servers 50 --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from timing import paired_added, timed  # noqa: E402

from gateway.config.settings import Settings  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.upstreams.upstream import UpstreamSpec  # noqa: E402
from tests.servers.demo_server import create_server  # noqa: E402

BLOCK = 200

logging.getLogger("gateway").setLevel(logging.WARNING)


def spec(name: str) -> UpstreamSpec:
    return UpstreamSpec(id=name, prefix=name, transport="memory", target=create_server(name))


async def per_request(registry: Registry, calls: int) -> dict[str, Any]:
    upstream = registry.upstreams["s0"]

    async def send(client: Any) -> Any:
        return await client.call_tool("echo", {"text": "x"})

    async def before(operation: str, send: Any) -> Any:
        """`Upstream.request` as it was before live reload: the on-demand counters around `_send`."""
        upstream.on_demand.begin()
        try:
            if upstream.state == "idle":
                upstream.on_demand.want()
            return await upstream._send(operation, send, upstream.call_timeout)
        finally:
            upstream.on_demand.end()

    variants = {
        "request": lambda: upstream.request("tools/call", send),
        "before": lambda: before("tools/call", send),
        "_send": lambda: upstream._send("tools/call", send, upstream.call_timeout),
    }
    for work in variants.values():  # warm-up
        await timed(work, 500)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for turn in range(calls // BLOCK):
        for name in order[turn % 3 :] + order[: turn % 3]:
            samples[name] += await timed(variants[name], BLOCK)
    base = statistics.median(samples["before"])
    added = paired_added(samples["request"], samples["before"], BLOCK)
    return {
        "calls": calls,
        "send_median_us": round(statistics.median(samples["_send"]), 1),
        "before_median_us": round(base, 1),
        "request_median_us": round(statistics.median(samples["request"]), 1),
        "added_us": round(added, 2),
        "added_pct": round(100 * added / base, 2),
        "wrapper_before_us": round(paired_added(samples["before"], samples["_send"], BLOCK), 2),
    }


async def per_reload(registry: Registry, specs: list[UpstreamSpec], rounds: int) -> dict[str, Any]:
    unchanged: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        changes = await registry.apply_specs(specs, drain_seconds=5)
        unchanged.append((time.perf_counter() - started) * 1000)
        assert not changes.changed and not changes.added
    changed_apply: list[float] = []
    changed_ready: list[float] = []
    for i in range(rounds):
        replaced = [*specs[:-1], dataclasses.replace(spec(specs[-1].id), description=f"round {i}")]
        ready = anyio.Event()

        async def on_change(_kinds: set[str], ready: anyio.Event = ready, tool: str = f"{specs[-1].id}__echo") -> None:
            if tool in registry.catalog.tools:
                ready.set()

        started = time.perf_counter()
        changes = await registry.apply_specs(replaced, drain_seconds=5)
        changed_apply.append((time.perf_counter() - started) * 1000)
        registry.change_listeners.append(on_change)
        with anyio.fail_after(30):
            await ready.wait()
        changed_ready.append((time.perf_counter() - started) * 1000)
        registry.change_listeners.remove(on_change)
        assert changes.changed == (specs[-1].id,)
        specs = replaced
    return {
        "servers": len(specs),
        "rounds": rounds,
        "unchanged_apply_ms": round(statistics.median(unchanged), 2),
        "one_changed_apply_ms": round(statistics.median(changed_apply), 2),
        "one_changed_tools_back_ms": round(statistics.median(changed_ready), 2),
    }


async def main(calls: int, servers: int, rounds: int) -> dict[str, Any]:
    specs = [spec(f"s{i}") for i in range(servers)]
    with tempfile.TemporaryDirectory() as data:
        settings = Settings(data_dir=Path(data), config=Path(data) / "gateway.yaml")
        registry = Registry(specs, settings)
        async with registry.running():
            await registry.wait_settled(60)
            return {
                "per_request": await per_request(registry, calls),
                "per_reload": await per_reload(registry, specs, rounds),
            }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--servers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = anyio.run(main, args.calls, args.servers, args.rounds)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        r, a = result["per_request"], result["per_reload"]
        print(f"per request ({r['calls']} calls per variant, in-memory echo, paired blocks of {BLOCK}):")
        print(f"  _send (no wrapper)      median {r['send_median_us']:8.1f} us")
        print(f"  request, before reload  median {r['before_median_us']:8.1f} us")
        print(f"  request, now            median {r['request_median_us']:8.1f} us")
        print(f"  added by live reload's bookkeeping {r['added_us']:6.2f} us ({r['added_pct']:.2f} %)")
        print(f"  (the wrapper before it: {r['wrapper_before_us']:.2f} us)")
        print(f"per reload ({a['servers']} in-memory servers, median of {a['rounds']}):")
        print(f"  nothing changed: apply_specs          {a['unchanged_apply_ms']:8.2f} ms")
        print(f"  one server changed: apply_specs       {a['one_changed_apply_ms']:8.2f} ms")
        print(f"  one server changed: its tools back    {a['one_changed_tools_back_ms']:8.2f} ms")
