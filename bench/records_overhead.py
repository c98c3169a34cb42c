"""What recording costs a proxied call: the same gateway with records on and off, in one process.

Two gateways run side by side in this process, each in front of its own in-memory demo
server (`mem__echo`):

- baseline: no records (as with `GATEWAY_RECORDS__ENABLED=false`);
- records:  records on with the default settings (SQLite in a temporary data dir, WAL,
            the writer thread flushing every second); every call is captured, buffered,
            redacted and written, and its result gets a feedback token.

Each is measured at two levels: `chain` calls `Registry.call_tool` (the call chain and
the upstream, where the recorder sits) and `client` calls through the SDK's client over
the in-memory transport (plus the server's handler, which adds the feedback token).
The variants take turns in blocks (round robin, order rotated every round), so noise
falls on all of them alike; the added cost is the median over blocks of the difference
of block medians, with records vs without.

    python bench/records_overhead.py                  # 5000 measured calls per variant
    python bench/records_overhead.py --calls 1000 --json
    python bench/records_overhead.py --text-bytes 100000 --calls 1000   # large calls: stored cut
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.config.runtime_settings import RecordsSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.records.service import Records, open_store  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.serving.server import GatewayServer  # noqa: E402
from gateway.upstreams.upstream import UpstreamSpec  # noqa: E402
from tests.servers.demo_server import create_server  # noqa: E402


@dataclass
class Variant:
    key: str
    call: Callable[[], Awaitable[Any]] | None = None
    samples: list[float] = field(default_factory=list)


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter_ns()
    await call()
    return (time.perf_counter_ns() - started) / 1e6


async def _measure(variants: list[Variant], calls: int, warmup: int, block: int) -> None:
    for v in variants:
        assert v.call is not None
        for _ in range(warmup):
            await v.call()
    for r in range(-(-calls // block)):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            assert v.call is not None
            for _ in range(min(block, calls - len(v.samples))):
                v.samples.append(await _timed(v.call))
        gc.collect()  # between blocks: a collection pause lands on no call


def _added(variant: Variant, base: Variant, block: int) -> float:
    """Median over blocks of (block median - baseline block median)."""
    diffs = [
        statistics.median(variant.samples[i : i + block]) - statistics.median(base.samples[i : i + block])
        for i in range(0, min(len(variant.samples), len(base.samples)), block)
    ]
    return statistics.median(diffs)


async def _gateway(
    stack: AsyncExitStack, data_dir: Path, recorded: bool
) -> tuple[Registry, GatewayServer, Records | None]:
    settings = Settings(
        data_dir=data_dir, records=RecordsSettings(enabled=recorded), embedding=EmbeddingSettings(enabled=False)
    )
    registry = Registry(
        [UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))], settings
    )
    records = None
    if recorded:
        records = Records(settings.records, open_store(settings))
        registry.record_calls(records.recorder)
    await stack.enter_async_context(registry.running())
    if records is not None:
        await stack.enter_async_context(records.running())
    await registry.wait_settled(30)
    return registry, GatewayServer(registry, settings, records=records), records


async def main_async(calls: int, warmup: int, block: int, text_bytes: int) -> dict[str, Any]:
    arguments = {"text": "hello"[:text_bytes] if text_bytes <= 5 else "x" * text_bytes}
    with tempfile.TemporaryDirectory(prefix="mcp-gateway-bench-") as tmp:
        async with AsyncExitStack() as stack:
            base_registry, base_server, _ = await _gateway(stack, Path(tmp) / "off", recorded=False)
            rec_registry, rec_server, records = await _gateway(stack, Path(tmp) / "on", recorded=True)
            assert records is not None
            base_client = await stack.enter_async_context(Client(base_server.server))
            rec_client = await stack.enter_async_context(Client(rec_server.server))
            variants = [
                Variant("chain/baseline", lambda: base_registry.call_tool("mem__echo", arguments)),
                Variant("chain/records", lambda: rec_registry.call_tool("mem__echo", arguments)),
                Variant("client/baseline", lambda: base_client.call_tool("mem__echo", arguments)),
                Variant("client/records", lambda: rec_client.call_tool("mem__echo", arguments)),
            ]
            started = time.perf_counter()
            await _measure(variants, calls, warmup, block)
            elapsed = time.perf_counter() - started
            await records.flush()
            written, dropped = records.writer.written, records.writer.dropped
            stored = sum(path.stat().st_size for path in (Path(tmp) / "on").glob("records.sqlite3*"))
    by_key = {v.key: v for v in variants}
    rows = {}
    for v in variants:
        median = statistics.median(v.samples)
        row: dict[str, Any] = {"n": len(v.samples), "median_ms": round(median, 4)}
        if v.key.endswith("/records"):
            base = by_key[v.key.replace("/records", "/baseline")]
            row["added_ms"] = round(_added(v, base, block), 4)
            row["ratio"] = round(median / statistics.median(base.samples), 3)
        rows[v.key] = row
    return {
        "calls": calls,
        "text_bytes": len(arguments["text"]),
        "block": block,
        "seconds": round(elapsed, 1),
        "records_written": written,
        "records_dropped": dropped,
        "store_bytes": stored,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=5000, help="measured calls per variant")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--block", type=int, default=100)
    parser.add_argument("--text-bytes", type=int, default=5, help="size of the echoed text (5: 'hello')")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = anyio.run(main_async, args.calls, args.warmup, args.block, args.text_bytes)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"{report['calls']} calls per variant of {report['text_bytes']} bytes of text, "
        f"in blocks of {report['block']}, {report['seconds']} s"
    )
    print(
        f"records written {report['records_written']}, dropped {report['records_dropped']}, "
        f"store {report['store_bytes'] / 1e6:.1f} MB"
    )
    print(f"{'variant':<18}{'median ms':>10}{'added ms':>10}{'ratio':>8}")
    for key, row in report["results"].items():
        added = f"{row['added_ms']:.4f}" if "added_ms" in row else "-"
        ratio = f"{row['ratio']:.3f}" if "ratio" in row else "-"
        print(f"{key:<18}{row['median_ms']:>10.4f}{added:>10}{ratio:>8}")


if __name__ == "__main__":
    main()
