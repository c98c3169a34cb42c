"""Many concurrent calls through the gateway to a slow upstream finish together, not in turn.

Path: the SDK's `Client` (in memory) -> the gateway (`GatewayServer` over a `Registry`)
-> the demo server as a stdio child, tool `sleep` (100 ms by default). N calls are
started at once; the run reports the wall time against the serialized time (N x the
delay), for each per-upstream cap on calls in flight (`max_concurrent_calls`), and
checks that every call got exactly one answer, its own.

    python bench/concurrent_calls.py                   # 500 calls, caps 32 (default) and 500
    python bench/concurrent_calls.py --calls 200 --delay 0.05 --json

The stdio child is stopped with its process group when the run ends, also on error.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
from mcp import Client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.config.loader import parse_config  # noqa: E402
from gateway.config.runtime_settings import ResilienceSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.server_specs import specs_from_config  # noqa: E402
from gateway.serving.server import GatewayServer  # noqa: E402

DEMO_SERVER = REPO / "tests" / "servers" / "demo_server.py"


async def one_run(calls: int, delay: float, cap: int, data_dir: Path) -> dict[str, Any]:
    config = parse_config(
        f"mcps:\n  slow:\n    command: {json.dumps(sys.executable)}\n"
        f"    args: {json.dumps([str(DEMO_SERVER), 'stdio', '--name', 'slow'])}\n",
        Path("bench.yaml"),
    )
    settings = Settings(data_dir=data_dir, resilience=ResilienceSettings(max_concurrent_calls=cap))
    registry = Registry(specs_from_config(config), settings)
    answers: dict[int, list[str]] = {i: [] for i in range(calls)}
    latencies: list[float] = []
    async with registry.running():
        await registry.wait_settled(60)
        gateway = GatewayServer(registry, settings)
        async with Client(gateway.server) as client:
            await client.call_tool("slow__sleep", {"seconds": 0.0})  # warm up the path

            async def call(i: int) -> None:
                started = time.perf_counter()
                result = await client.call_tool("slow__sleep", {"seconds": delay + i * 1e-9})
                latencies.append(time.perf_counter() - started)
                block = result.content[0]
                answers[i].append(block.text if isinstance(block, types.TextContent) and not result.is_error else "!")

            started = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for i in range(calls):
                    tg.start_soon(call, i)
            wall = time.perf_counter() - started
    serialized = calls * delay
    return {
        "calls": calls,
        "delay_s": delay,
        "max_concurrent_calls": cap,
        "wall_s": round(wall, 3),
        "serialized_s": round(serialized, 3),
        "speedup": round(serialized / wall, 1),
        "lower_bound_s": round(delay * -(-calls // cap), 3),
        "latency_p50_ms": round(statistics.median(latencies) * 1000, 1),
        "latency_max_ms": round(max(latencies) * 1000, 1),
        "exactly_one_answer_each": all(len(a) == 1 and a[0] == f"slept {delay + i * 1e-9}" for i, a in answers.items()),
    }


async def bounded_run(calls: int, delay: float, cap: int, data_dir: Path) -> dict[str, Any]:
    with anyio.fail_after(600):
        return await one_run(calls, delay, cap, data_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--delay", type=float, default=0.1, help="seconds each upstream call sleeps")
    parser.add_argument("--caps", default="32,500", help="max_concurrent_calls values to compare")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for cap in (int(c) for c in args.caps.split(",")):
            runs.append(anyio.run(bounded_run, args.calls, args.delay, cap, Path(tmp)))
    print(f"# {platform.python_version()} on {platform.machine()}, {args.calls} calls of {args.delay * 1000:g} ms")
    for run in runs:
        print(
            f"cap {run['max_concurrent_calls']:>4}: wall {run['wall_s']:.2f} s "
            f"vs serialized {run['serialized_s']:.1f} s "
            f"(x{run['speedup']}, lower bound {run['lower_bound_s']:.2f} s); p50 {run['latency_p50_ms']} ms, "
            f"max {run['latency_max_ms']} ms; exactly one answer each: {run['exactly_one_answer_each']}"
        )
    if args.json:
        print(json.dumps(runs))


if __name__ == "__main__":
    main()
