"""What Prometheus metrics cost: per proxied call, and per scrape of `GET /metrics`.

    python bench/metrics_overhead.py              # figures on stdout
    python bench/metrics_overhead.py --json       # and one JSON object as the last line

Measured in one process, the variants interleaved in rounds (the order alternating) so
machine load falls on both alike:

1. the call chain alone: `Registry.call_chain` composed with and without its outermost
   `CallMetrics` layer, around an upstream that answers at once (validation, retry,
   breaker and timeout run in both), so the difference is the metrics layer alone;
2. a whole call to the demo server in memory through `Registry.call_tool`, with the
   registry's chain as built and with the metrics layer taken out;
3. one scrape (`GatewayMetrics.exposition()`) of a gateway whose 50 servers of 20
   tools each have all been called: 1000 call series, 50 latency histograms, states.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mcp_types as types  # noqa: E402
from timing import timed  # noqa: E402

from gateway.calls import ToolCall, compose  # noqa: E402
from gateway.calls.metrics import CallMetrics  # noqa: E402
from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.upstreams.upstream import UpstreamSpec  # noqa: E402
from tests.servers.demo_server import create_server  # noqa: E402

logging.getLogger("gateway").setLevel(logging.WARNING)

Work = Callable[[], Awaitable[Any]]
TOOL = types.Tool(name="echo", input_schema={"type": "object", "properties": {"text": {"type": "string"}}})
RESULT = types.CallToolResult(content=[types.TextContent(type="text", text="hello")])


async def interleaved(variants: dict[str, Work], calls: int, rounds: int, warmup: int) -> dict[str, list[float]]:
    for work in variants.values():
        await timed(work, warmup)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    per_round = max(1, calls // rounds)
    names = list(variants)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name] += await timed(variants[name], per_round)
    return samples


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"median_us": statistics.median(ordered), "p95_us": ordered[int(len(ordered) * 0.95)], "n": len(ordered)}


def _tool_call(server: str = "mem", tool: str = "mem__echo") -> ToolCall:
    async def send(arguments: dict[str, Any] | None) -> types.CallToolResult:
        return RESULT

    return ToolCall(
        server=server, name=tool, original="echo", tool=TOOL, arguments={"text": "hello"}, send=send,
        timeout=60.0, idempotent=True,
    )  # fmt: skip


def _without_metrics(registry: Registry) -> list[Any]:
    chain = [layer for layer in registry.call_chain if not isinstance(layer, CallMetrics)]
    assert len(chain) == len(registry.call_chain) - 1, "the registry's chain has no CallMetrics layer"
    return chain


async def chain_only(registry: Registry, calls: int, rounds: int) -> dict[str, list[float]]:
    with_metrics, without = compose(registry.call_chain), compose(_without_metrics(registry))
    return await interleaved(
        {
            "chain without metrics": lambda: without(_tool_call()),
            "chain with metrics": lambda: with_metrics(_tool_call()),
        },
        calls,
        rounds,
        warmup=500,
    )


async def in_memory_calls(registry: Registry, calls: int, rounds: int) -> dict[str, list[float]]:
    with_metrics, without = compose(registry.call_chain), compose(_without_metrics(registry))

    async def call(handler: Any) -> None:
        registry._run_call = handler  # the one seam between the registry and its chain
        result = await registry.call_tool("mem__echo", {"text": "hello"})
        assert not result.is_error

    variants = {
        "in-memory call without metrics": lambda: call(without),
        "in-memory call with metrics": lambda: call(with_metrics),
    }
    return await interleaved(variants, calls, rounds, warmup=200)


def scrape(registry: Registry, scrapes: int) -> list[float]:
    metrics = registry.metrics
    for server in range(50):
        for tool in range(20):
            metrics.observe_call(f"s{server}", f"s{server}__tool_{tool}", "success", None, 0.01)
        metrics.observe_call(f"s{server}", f"s{server}__tool_0", "error", "upstream_timeout", 1.0)
    metrics.exposition()
    samples = []
    for _ in range(scrapes):
        started = time.perf_counter()
        body = metrics.exposition()
        samples.append((time.perf_counter() - started) * 1e6)
    assert b"s49__tool_19" in body
    return samples


async def main(calls: int, rounds: int, scrapes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp), embedding=EmbeddingSettings(enabled=False))
        spec = UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))
        registry = Registry([spec], settings)
        async with registry.running():
            await registry.wait_settled(30)
            results = {**await chain_only(registry, calls, rounds), **await in_memory_calls(registry, calls, rounds)}
        results["scrape, 50 servers x 20 tools"] = scrape(Registry([], settings), scrapes)
    report: dict[str, Any] = {name: summary(samples) for name, samples in results.items()}
    for kind in ("chain", "in-memory call"):
        base, metered = report[f"{kind} without metrics"], report[f"{kind} with metrics"]
        report[f"{kind}: added"] = {
            "added_us": metered["median_us"] - base["median_us"],
            "ratio": metered["median_us"] / base["median_us"],
        }
    return report


def _print(report: dict[str, Any]) -> None:
    for name, row in report.items():
        if "added_us" in row:
            print(f"{name:42s} {row['added_us']:+8.1f} us  ({row['ratio']:.2f}x)")
        else:
            print(f"{name:42s} median {row['median_us']:9.1f} us  p95 {row['p95_us']:9.1f} us  (n={row['n']})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000, help="measured calls per variant")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.calls, args.rounds, args.scrapes))
    _print(result)
    if args.json:
        print(json.dumps(result))
