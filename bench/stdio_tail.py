"""What puts the tail (p95, p99) of a proxied stdio call far above its median.

The SDK's `Client` over stdio calls `child__echo` through `python -m gateway serve` (the demo
server as its stdio child, BM25 only), one call at a time, in gateway variants that each
remove one suspect:

- base:        the gateway as it ships (records on: the writer thread flushes every second)
- no-records:  `GATEWAY_RECORDS__ENABLED=false` (no records writer thread, no recorder layer)
- sdk-path:    `GATEWAY_LEAN_PATH=false` (every request through the SDK's session)
- no-gc:       the gateway's (and its child's) cyclic garbage collector off (`gc.disable()`
               in a `sitecustomize` put first on `PYTHONPATH`)
- no-freeze:   without the freeze of the start-up's objects (`gateway.collector`: `gc.freeze()`
               made a no-op in the same `sitecustomize`)

and `direct`, the client to the demo server itself. The variants take turns in blocks of
`--block` calls, the order rotated every round; the client collects its own garbage between
blocks, so its collections land on no call. The base gateway also logs every collection of
its own that takes 0.5 ms or more, or is of generation 1 or 2 (a `gc.callbacks` hook in the
same `sitecustomize`), and the table gives their number and total time per 1000 calls.

    python bench/stdio_tail.py                   # 1000 measured calls per variant
    python bench/stdio_tail.py --calls 300 --json
    python bench/stdio_tail.py --variants direct,base,no-freeze --calls 3000
    python bench/stdio_tail.py --mode auto      # the client negotiating 2026-07-28 (the default: legacy)

Every process it starts is a child of an SDK stdio client and is stopped when the run ends.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import textwrap
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from timing import percentile  # bench/ is on sys.path when run as `python bench/stdio_tail.py`

REPO = Path(__file__).resolve().parent.parent
DEMO_SERVER = REPO / "tests" / "servers" / "demo_server.py"

GC_LOG = """
import gc, os, time
_log = os.environ.get("BENCH_GC_LOG")
if os.environ.get("BENCH_GC_OFF"):
    gc.disable()
if os.environ.get("BENCH_NO_FREEZE"):
    gc.freeze = lambda: None
if _log:
    _started = [0.0, 0.0]
    def _hook(phase, info):
        if phase == "start":
            _started[:] = [time.perf_counter(), time.thread_time()]
            return
        took = (time.perf_counter() - _started[0]) * 1000
        cpu = (time.thread_time() - _started[1]) * 1000
        if took >= 0.5 or info["generation"] > 0:
            with open(_log, "a") as f:
                f.write(f"{info['generation']} {took:.3f} {cpu:.3f}\\n")
    gc.callbacks.append(_hook)
"""


@dataclass
class Variant:
    name: str
    env: dict[str, str]
    tool: str = "child__echo"
    client: Client | None = None
    samples: list[float] = field(default_factory=list)


def _variants(workdir: Path) -> list[Variant]:
    site = workdir / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(GC_LOG)
    path = f"{site}:{REPO}"

    def logged(name: str, **env: str) -> Variant:
        return Variant(name, {"PYTHONPATH": path, "BENCH_GC_LOG": str(workdir / f"gc-{name}.log"), **env})

    return [
        Variant("direct", {}, tool="echo"),
        logged("base"),
        logged("sdk-path", GATEWAY_LEAN_PATH="false"),
        logged("no-records", GATEWAY_RECORDS__ENABLED="false"),
        Variant("no-gc", {"PYTHONPATH": path, "BENCH_GC_OFF": "1"}),
        logged("no-freeze", BENCH_NO_FREEZE="1"),
    ]


async def _connect(stack: AsyncExitStack, variants: list[Variant], workdir: Path, mode: str) -> None:
    config = workdir / "gateway.yaml"
    config.write_text(
        textwrap.dedent(
            f"""\
            mcps:
              child:
                command: {json.dumps(sys.executable)}
                args: [{json.dumps(str(DEMO_SERVER))}, stdio, --name, child]
            """
        )
    )
    errlog = stack.enter_context((workdir / "stderr.log").open("w"))
    for v in variants:
        if v.name == "direct":
            params = StdioServerParameters(command=sys.executable, args=[str(DEMO_SERVER), "stdio"], cwd=str(REPO))
        else:
            env = {
                "GATEWAY_DATA_DIR": str(workdir / f"data-{v.name}"),
                "GATEWAY_PLUGINS__ENTRY_POINTS": "false",
                "GATEWAY_PLUGINS__DIRECTORY": str(workdir / "no-plugins"),
                "GATEWAY_EMBEDDING__ENABLED": "false",
                "GATEWAY_LOG_LEVEL": "WARNING",
                **v.env,
            }
            args = ["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"]
            params = StdioServerParameters(command=sys.executable, args=args, env=env, cwd=str(REPO))
        v.client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog), mode=mode))
        result = await v.client.call_tool(v.tool, {"text": "hello"})
        if result.is_error:
            raise RuntimeError(f"{v.name}: {v.tool} failed: {result.content}")


async def _measure(variants: list[Variant], calls: int, warmup: int, block: int) -> None:
    for v in variants:
        assert v.client is not None
        for _ in range(warmup):
            await v.client.call_tool(v.tool, {"text": "hello"})
    for r in range(-(-calls // block)):
        order = variants[r % len(variants) :] + variants[: r % len(variants)]
        for v in order:
            assert v.client is not None
            for _ in range(min(block, calls - len(v.samples))):
                started = time.perf_counter()
                await v.client.call_tool(v.tool, {"text": "hello"})
                v.samples.append((time.perf_counter() - started) * 1000)
        gc.collect()


def _row(v: Variant) -> dict[str, Any]:
    s = sorted(v.samples)
    p50, p95, p99 = (percentile(s, q) for q in (50, 95, 99))
    return {"variant": v.name, "n": len(s), "p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "p95_over_p50": p95 / p50}


def _collections(log: Path, calls: int) -> dict[str, Any]:
    """The logged collections of one gateway, per 1000 calls: count, wall ms, CPU ms, the longest."""
    lines = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
    per_1000 = 1000 / calls
    out = {}
    for g in ("1", "2"):
        mine = [(float(wall), float(cpu)) for gen, wall, cpu in lines if gen == g]
        out[f"gen{g}"] = {
            "per_1000_calls": len(mine) * per_1000,
            "wall_ms_per_1000_calls": sum(w for w, _ in mine) * per_1000,
            "cpu_ms_per_1000_calls": sum(c for _, c in mine) * per_1000,
            "longest_wall_ms": max((w for w, _ in mine), default=0.0),
            "longest_cpu_ms": max((c for _, c in mine), default=0.0),
        }
    return out


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mcp-gateway-bench-") as tmp:
        workdir = Path(tmp)
        variants = [v for v in _variants(workdir) if not args.variants or v.name in args.variants.split(",")]
        with anyio.fail_after(args.timeout):
            async with AsyncExitStack() as stack:
                await _connect(stack, variants, workdir, args.mode)
                for log in workdir.glob("gc-*.log"):
                    log.write_text("")  # the start-up's collections are not the calls'
                await _measure(variants, args.calls, args.warmup, args.block)
                collections = {
                    v.name: _collections(Path(v.env["BENCH_GC_LOG"]), args.calls + args.warmup)
                    for v in variants
                    if "BENCH_GC_LOG" in v.env
                }
    rows = [_row(v) for v in variants]
    return {"benchmark": "stdio_tail", "calls": args.calls, "block": args.block, "rows": rows, "gc": collections}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=1000, help="measured calls per variant (1000)")
    parser.add_argument("--warmup", type=int, default=100, help="unmeasured calls per variant first (100)")
    parser.add_argument("--block", type=int, default=50, help="calls per turn (50)")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run, seconds (600)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object, last on stdout")
    parser.add_argument("--variants", default="", help="comma-separated names to run (default: all)")
    parser.add_argument("--mode", choices=("legacy", "auto"), default="legacy", help="the client's protocol mode")
    args = parser.parse_args(argv)
    result = anyio.run(_run, args)
    print(f"{'variant':<11} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} {'p95/p50':>7}")
    for r in result["rows"]:
        print(f"{r['variant']:<11} {r['p50_ms']:7.3f} {r['p95_ms']:7.3f} {r['p99_ms']:7.3f} {r['p95_over_p50']:7.2f}")
    for name, gens in result["gc"].items():
        for gen, g in gens.items():
            print(
                f"{name} {gen}: {g['per_1000_calls']:.1f} per 1000 calls, {g['cpu_ms_per_1000_calls']:.1f} ms CPU "
                f"({g['wall_ms_per_1000_calls']:.1f} wall), longest {g['longest_cpu_ms']:.1f} ms CPU "
                f"({g['longest_wall_ms']:.1f} wall)"
            )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
