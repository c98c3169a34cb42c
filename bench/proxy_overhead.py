"""Latency a gateway hop adds to a trivial tool call, against a direct call.

Every variant uses the same downstream transport, the SDK's `Client` over stdio:

- direct:            client -> `tests/servers/demo_server.py stdio --name mem`, tool `echo`
- gateway -> memory: client -> `python -m gateway serve` -> the `mem` demo server that the
                     fixture plugin registers in memory, tool `mem__echo`
- gateway -> child:  the same gateway -> the demo server as a stdio child process, tool
                     `child__echo` (a second process hop)
- gateway (SDK path) -> child: in `legacy` mode, a second gateway with `GATEWAY_LEAN_PATH=false`
                     (every request through the SDK's session: the lean path's baseline)
- FastMCP -> child:  `bench/fastmcp_proxy.py stdio` (FastMCP's `create_proxy` over one connected
                     session) -> the demo server as a stdio child, tool `echo`: the peer

each in the protocol modes of the client (`--modes`): `auto` (negotiates 2026-07-28) and
`legacy` (the initialize handshake). The gateway's own upstream clients always use `auto`.

After a warm-up, the variants take turns in blocks of calls (round robin, the order
rotated every round), so whatever noise the machine has falls on all of them alike.
Gateway rows are compared with the direct row of the same client mode: the ratio of
medians and the difference of medians (the added latency per proxied call).

    python bench/proxy_overhead.py                # 2000 measured calls per variant
    python bench/proxy_overhead.py --calls 500 --json
    python bench/proxy_overhead.py --modes legacy    # the handshake era alone (the stdio lean path's)

Every process it starts is a child of an SDK stdio client and is stopped (with its own
children) when the run ends, also on error or timeout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import textwrap
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from timing import (
    add_paired_options,
    check_paired_options,
    paired_added,
    percentile,
)  # bench/ is on sys.path when run as `python bench/proxy_overhead.py`

REPO = Path(__file__).resolve().parent.parent
DEMO_SERVER = REPO / "tests" / "servers" / "demo_server.py"
FIXTURE_PLUGINS = REPO / "tests" / "fixtures" / "plugins"
FASTMCP_PROXY = REPO / "bench" / "fastmcp_proxy.py"
MODES = ("auto", "legacy")
TEXT = "hello"


@dataclass
class Variant:
    key: str
    label: str
    mode: str
    tool: str
    baseline: str | None
    client: Client | None = None
    samples: list[float] = field(default_factory=list)
    """Per-call latency in milliseconds."""


def _stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "n": len(s),
        "median_ms": percentile(s, 50),
        "p95_ms": percentile(s, 95),
        "p99_ms": percentile(s, 99),
        "min_ms": s[0] if s else float("nan"),
        "mean_ms": statistics.fmean(s) if s else float("nan"),
    }


def _gateway_env(data_dir: Path) -> dict[str, str]:
    """The gateway child's environment: quiet logs, a throwaway data dir, the fixture plugins.

    `StdioServerParameters.env` is merged over the SDK's small default environment, so
    no other `GATEWAY_*` variable of the caller leaks in.
    """
    return {
        "GATEWAY_DATA_DIR": str(data_dir),
        "GATEWAY_PLUGINS__DIRECTORY": str(FIXTURE_PLUGINS),
        "GATEWAY_PLUGINS__ENTRY_POINTS": "false",  # the fixture plugin alone, not the installed built-ins
        "GATEWAY_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(REPO),
    }


def _write_config(directory: Path) -> Path:
    """A minimal config: one stdio child upstream. The in-memory `mem` comes from the plugin."""
    path = directory / "gateway.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            mcps:
              child:
                description: the demo server as a stdio child process
                command: {json.dumps(sys.executable)}
                args: [{json.dumps(str(DEMO_SERVER))}, stdio, --name, child]
            """
        )
    )
    return path


def _variants(modes: tuple[str, ...]) -> list[Variant]:
    out: list[Variant] = []
    for mode in modes:
        direct = f"direct/{mode}"
        out.append(Variant(direct, "direct (stdio)", mode, "echo", None))
        out.append(Variant(f"gw-mem/{mode}", "gateway -> in-memory", mode, "mem__echo", direct))
        out.append(Variant(f"gw-child/{mode}", "gateway -> stdio child", mode, "child__echo", direct))
        if mode == "legacy":  # the 2026-07-28 era is the SDK's on both gateways
            out.append(Variant(f"gw-sdk/{mode}", "gateway (SDK path) -> stdio child", mode, "child__echo", direct))
        out.append(Variant(f"fastmcp/{mode}", "FastMCP proxy -> stdio child", mode, "echo", direct))
    return out


async def _call(client: Client, tool: str) -> float:
    started = time.perf_counter_ns()
    result = await client.call_tool(tool, {"text": TEXT})
    elapsed = (time.perf_counter_ns() - started) / 1e6
    if result.is_error:
        raise RuntimeError(f"{tool} returned an error: {result.content}")
    return elapsed


def _check_echo(result: types.CallToolResult, tool: str) -> None:
    first = result.content[0] if result.content else None
    if not isinstance(first, types.TextContent) or first.text != TEXT:
        raise RuntimeError(f"{tool} did not echo {TEXT!r}: {result.content!r}")


async def _connect(stack: AsyncExitStack, variants: list[Variant], workdir: Path, errlog: TextIO) -> None:
    """Start one direct demo server, gateways and a FastMCP proxy per client mode; the gateway rows
    of a mode share one gateway."""
    config = _write_config(workdir)
    child = [str(DEMO_SERVER), "stdio", "--name", "child"]
    for mode in sorted({v.mode for v in variants}):
        gateway = ["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"]
        servers = {
            "direct": StdioServerParameters(
                command=sys.executable, args=[str(DEMO_SERVER), "stdio", "--name", "mem"], cwd=str(REPO)
            ),
            "gw": StdioServerParameters(
                command=sys.executable, args=gateway, env=_gateway_env(workdir / f"data-{mode}"), cwd=str(REPO)
            ),
            "gw-sdk": StdioServerParameters(
                command=sys.executable,
                args=gateway,
                env=_gateway_env(workdir / f"data-sdk-{mode}") | {"GATEWAY_LEAN_PATH": "false"},
                cwd=str(REPO),
            ),
            "fastmcp": StdioServerParameters(
                command=sys.executable, args=[str(FASTMCP_PROXY), "stdio", "--", sys.executable, *child], cwd=str(REPO)
            ),
        }
        clients: dict[str, Client] = {}
        for v in variants:
            if v.mode == mode:
                kind = v.key.split("/")[0]
                server = "gw" if kind in ("gw-mem", "gw-child") else kind
                if server not in clients:
                    connected = Client(stdio_client(servers[server], errlog=errlog), mode=mode)
                    clients[server] = await stack.enter_async_context(connected)
                v.client = clients[server]
    for v in variants:
        assert v.client is not None
        listed = {t.name for t in (await v.client.list_tools()).tools}
        if v.tool not in listed:
            raise RuntimeError(f"{v.key}: tool {v.tool!r} is not listed; got {sorted(listed)}")
        _check_echo(await v.client.call_tool(v.tool, {"text": TEXT}), v.tool)


async def _measure(variants: list[Variant], calls: int, warmup: int, block: int) -> None:
    for v in variants:
        assert v.client is not None
        for _ in range(warmup):
            await _call(v.client, v.tool)
    rounds = -(-calls // block)
    for r in range(rounds):
        shift = r % len(variants)
        order = variants[shift:] + variants[:shift]
        for v in order:
            assert v.client is not None
            for _ in range(min(block, calls - len(v.samples))):
                v.samples.append(await _call(v.client, v.tool))
        # Collect between blocks, not inside them: a collection pause lands on no call.
        gc.collect()


def _report(variants: list[Variant], block: int) -> list[dict[str, Any]]:
    by_key = {v.key: v for v in variants}
    rows = []
    for v in variants:
        row: dict[str, Any] = {"variant": v.key, "path": v.label, "mode": v.mode, "tool": v.tool, **_stats(v.samples)}
        if v.baseline is not None:
            base = by_key[v.baseline]
            base_median = statistics.median(base.samples)
            row["baseline"] = v.baseline
            row["ratio"] = row["median_ms"] / base_median
            row["added_ms"] = row["median_ms"] - base_median
            row["added_ms_paired"] = paired_added(v.samples, base.samples, block)
        rows.append(row)
    return rows


def _print_table(rows: list[dict[str, Any]]) -> None:
    headers = ["path", "mode", "median ms", "p95 ms", "p99 ms", "x direct", "added ms"]
    table = [
        [
            r["path"],
            r["mode"],
            f"{r['median_ms']:.3f}",
            f"{r['p95_ms']:.3f}",
            f"{r['p99_ms']:.3f}",
            f"{r['ratio']:.2f}" if "ratio" in r else "-",
            f"{r['added_ms']:+.3f}" if "added_ms" in r else "-",
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [headers, *table]) for i in range(len(headers))]
    for line in [headers, *table]:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        print("  ".join(cells).rstrip())


def _machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mcp": version("mcp"),
        "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
    }


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    variants = _variants(tuple(args.modes.split(",")))
    with tempfile.TemporaryDirectory(prefix="mcp-gateway-bench-") as tmp:
        workdir = Path(tmp)
        errlog_path = workdir / "stderr.log"
        with errlog_path.open("w") as errlog:
            try:
                with anyio.fail_after(args.timeout):
                    async with AsyncExitStack() as stack:
                        started = time.perf_counter()
                        await _connect(stack, variants, workdir, errlog)
                        connected = time.perf_counter()
                        await _measure(variants, args.calls, args.warmup, args.block)
                        measured = time.perf_counter()
                    # Leaving the stack stopped every client, and with it every child process.
            except BaseException:
                errlog.flush()
                tail = errlog_path.read_text()[-3000:]
                if tail.strip():
                    print(f"--- stderr of the child processes (tail) ---\n{tail}", file=sys.stderr)
                raise
    rows = _report(variants, args.block)
    return {
        "benchmark": "proxy_overhead",
        "calls": args.calls,
        "warmup": args.warmup,
        "block": args.block,
        "machine": _machine(),
        "connect_s": round(connected - started, 2),
        "measure_s": round(measured - connected, 2),
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_paired_options(parser, calls=2000, warmup=200, timeout=600)
    parser.add_argument("--json", action="store_true", help="also print one JSON object, last on stdout")
    parser.add_argument("--modes", default=",".join(MODES), help="the client's protocol modes (auto,legacy)")
    args = parser.parse_args(argv)
    if not args.modes or not set(args.modes.split(",")) <= set(MODES):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    check_paired_options(parser, args)

    try:
        result = anyio.run(_run, args)
    except TimeoutError:
        print(f"proxy overhead: the run did not finish within {args.timeout:g} s (--timeout)", file=sys.stderr)
        return 1
    m = result["machine"]
    print(
        f"proxy overhead: {args.calls} calls per variant after {args.warmup} warm-up, blocks of {args.block}; "
        f"{m['cpus']} CPUs, Python {m['python']}, mcp {m['mcp']}, load {m['loadavg']}"
    )
    print(f"connect {result['connect_s']} s, measure {result['measure_s']} s\n")
    _print_table(result["rows"])
    print("\n'x direct' and 'added ms' compare medians with the direct row of the same client mode.")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
