"""What tracing costs a proxied call: the same gateway with tracing off, on with sampling 0, and on
with sampling 1 exporting every span, side by side in one run.

Tracing is process-wide (one tracer provider per process), so each variant is its own gateway
process, `python -m gateway serve` over stdio, in front of the in-memory `mem` demo server that
the fixture plugin registers (tool `mem__echo`), with records on as by default:

- off:        `GATEWAY_TRACING__ENABLED` unset, as today's default;
- sampling 0: tracing on, `OTEL_TRACES_SAMPLER=always_off` (spans are made, none recorded);
- sampling 1: tracing on, `OTEL_TRACES_SAMPLER=always_on`, every span batch-exported over OTLP/HTTP
              to a real receiver in its own process (`tests/otlp_receiver.py`) on 127.0.0.1;
- baseline (with `--baseline-tree DIR`): a gateway from another source tree, e.g. the commit
              before tracing (`git archive <commit> | tar -x -C DIR`), to compare "off" with;
- sampling 1 without export (with `--unexported`): `OTEL_TRACES_EXPORTER=none`, what making and
              recording the spans costs without encoding and sending them;
- sampling 1 without layer spans (with `--no-layers`): `GATEWAY_TRACING__LAYER_SPANS=false`, exported.

The client is the SDK's `Client` over stdio (auto mode). After a warm-up the variants take turns in
blocks of calls, the order rotated every round, so the machine's noise falls on all alike; each row
is compared with "off": the ratio of medians and the median over blocks of the difference of block
medians (`added ms`). Latency between processes on a shared machine is noisy, so each gateway's
CPU time while the calls were measured (user + system, all threads: the exporter's included,
from `/proc`) is reported too, per call: less sensitive to scheduling than latency. At the end
it prints how many spans the receiver got (only sampling 1 exports).

    python bench/tracing_overhead.py                  # 3000 measured calls per variant
    python bench/tracing_overhead.py --calls 1000 --json
    python bench/tracing_overhead.py --baseline-tree /tmp/gateway-before
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, TextIO

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from timing import (
    add_paired_options,
    check_paired_options,
    cpu_ms,
    paired_added,
)  # bench/ is on sys.path when run as `python bench/tracing_overhead.py`

REPO = Path(__file__).resolve().parent.parent
FIXTURE_PLUGINS = REPO / "tests" / "fixtures" / "plugins"
RECEIVER = REPO / "tests" / "otlp_receiver.py"
TOOL, TEXT = "mem__echo", "hello"


@dataclass
class Variant:
    key: str
    env: dict[str, str]
    tree: Path = REPO
    client: Client | None = None
    samples: list[float] = field(default_factory=list)
    """Per-call latency in milliseconds."""
    pid: int = 0
    """The gateway's process id (the in-memory demo server's `pid` tool runs in it)."""
    cpu_s: float = 0.0
    """CPU seconds (user + system, all threads: the exporter's included) the gateway spent while the calls
    were measured (its idle work meanwhile too: the records' writer, pings; alike in every variant)."""


def _variants(endpoint: str, baseline: Path | None, unexported: bool, no_layers: bool) -> list[Variant]:
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench-gateway"}
    out = [
        Variant("off", {}),
        Variant("on, sampling 0", {"GATEWAY_TRACING__ENABLED": "true", "OTEL_TRACES_SAMPLER": "always_off", **otlp}),
        Variant("on, sampling 1", {"GATEWAY_TRACING__ENABLED": "true", "OTEL_TRACES_SAMPLER": "always_on", **otlp}),
    ]
    if unexported:  # what making and recording the spans costs, without encoding and sending them
        on = {"GATEWAY_TRACING__ENABLED": "true", "OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_EXPORTER": "none"}
        out.append(Variant("on, 1, no export", on))
    if no_layers:  # the SDK's spans and the call's attributes, without the validation and attempt spans
        lean = {"GATEWAY_TRACING__LAYER_SPANS": "false"}
        out.append(Variant("on, 1, no layers", {**out[2].env, **lean}))
    if baseline is not None:
        out.insert(0, Variant("baseline tree", {}, tree=baseline))
    return out


def _gateway_env(variant: Variant, data_dir: Path) -> dict[str, str]:
    return {
        "GATEWAY_DATA_DIR": str(data_dir),
        "GATEWAY_PLUGINS__DIRECTORY": str(FIXTURE_PLUGINS),
        "GATEWAY_PLUGINS__ENTRY_POINTS": "false",
        "GATEWAY_EMBEDDING__ENABLED": "false",
        "GATEWAY_LOG_LEVEL": "WARNING",
        "PYTHONPATH": str(variant.tree),
        **variant.env,
    }


async def _call(client: Client) -> float:
    started = time.perf_counter_ns()
    result = await client.call_tool(TOOL, {"text": TEXT})
    elapsed = (time.perf_counter_ns() - started) / 1e6
    if result.is_error:
        raise RuntimeError(f"{TOOL} returned an error: {result.content}")
    return elapsed


async def _connect(stack: AsyncExitStack, variants: list[Variant], workdir: Path, errlog: TextIO) -> None:
    config = workdir / "gateway.yaml"
    config.write_text("mcps: {}\n")
    for i, variant in enumerate(variants):
        params = StdioServerParameters(
            command=sys.executable,
            args=["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"],
            env=_gateway_env(variant, workdir / f"data-{i}"),
            cwd=str(variant.tree),
        )
        variant.client = await stack.enter_async_context(Client(stdio_client(params, errlog=errlog)))
        await _call(variant.client)
        answer = (await variant.client.call_tool("mem__pid", {})).content[0]
        variant.pid = int(answer.text)  # type: ignore[union-attr]


async def _measure(variants: list[Variant], calls: int, warmup: int, block: int) -> None:
    for v in variants:
        assert v.client is not None
        for _ in range(warmup):
            await _call(v.client)
    # CPU over the whole measurement, not per block: an exporter thread works on after its block.
    cpu = {v.key: cpu_ms(v.pid) / 1000 for v in variants}
    for r in range(-(-calls // block)):
        shift = r % len(variants)
        for v in variants[shift:] + variants[:shift]:
            assert v.client is not None
            for _ in range(min(block, calls - len(v.samples))):
                v.samples.append(await _call(v.client))
        gc.collect()  # between blocks: a collection pause lands on no call
    for v in variants:
        v.cpu_s = cpu_ms(v.pid) / 1000 - cpu[v.key]


def _report(variants: list[Variant], block: int) -> list[dict[str, Any]]:
    off = next(v for v in variants if v.key == "off")
    off_median = statistics.median(off.samples)
    off_cpu = off.cpu_s * 1000 / len(off.samples)
    rows = []
    for v in variants:
        s = sorted(v.samples)
        median = statistics.median(s)
        rows.append(
            {
                "variant": v.key,
                "n": len(s),
                "median_ms": median,
                "p95_ms": s[int(0.95 * (len(s) - 1))],
                "p99_ms": s[int(0.99 * (len(s) - 1))],
                "ratio_vs_off": median / off_median,
                "added_ms_vs_off": paired_added(v.samples, off.samples, block),
                "cpu_ms_per_call": v.cpu_s * 1000 / len(s),
                "added_cpu_ms_vs_off": v.cpu_s * 1000 / len(s) - off_cpu,
            }
        )
    return rows


def _start_receiver() -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(
        [sys.executable, str(RECEIVER)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("PORT="):
        process.kill()
        raise RuntimeError(f"the OTLP receiver did not start: {line!r}")
    return process, f"http://127.0.0.1:{line.strip().removeprefix('PORT=')}"


def _received(endpoint: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{endpoint}/count", timeout=10) as response:  # noqa: S310 (loopback)
        return dict(json.loads(response.read()))


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    receiver, endpoint = _start_receiver()
    try:
        variants = _variants(endpoint, args.baseline_tree, args.unexported, args.no_layers)
        with tempfile.TemporaryDirectory(prefix="mcp-gateway-bench-") as tmp:
            workdir = Path(tmp)
            errlog_path = workdir / "stderr.log"
            with errlog_path.open("w") as errlog:
                try:
                    with anyio.fail_after(args.timeout):
                        async with AsyncExitStack() as stack:
                            await _connect(stack, variants, workdir, errlog)
                            started = time.perf_counter()
                            await _measure(variants, args.calls, args.warmup, args.block)
                            measured = time.perf_counter() - started
                        # Leaving the stack stopped every gateway; each flushed its spans on the way out.
                except BaseException:
                    errlog.flush()
                    print(f"--- stderr of the gateways (tail) ---\n{errlog_path.read_text()[-3000:]}", file=sys.stderr)
                    raise
        received = _received(endpoint)
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
    return {
        "benchmark": "tracing_overhead",
        "calls": args.calls,
        "warmup": args.warmup,
        "block": args.block,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "mcp": version("mcp"),
            "opentelemetry-sdk": version("opentelemetry-sdk"),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        },
        "measure_s": round(measured, 1),
        "received": received,
        "rows": _report(variants, args.block),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_paired_options(parser, calls=3000, warmup=300, timeout=900)
    parser.add_argument("--baseline-tree", type=Path, help="also run a gateway from this source tree")
    parser.add_argument(
        "--unexported", action="store_true", help="also run sampling 1 with OTEL_TRACES_EXPORTER=none (no export)"
    )
    parser.add_argument(
        "--no-layers", action="store_true", help="also run sampling 1 with GATEWAY_TRACING__LAYER_SPANS=false"
    )
    parser.add_argument("--json", action="store_true", help="also print one JSON object, last on stdout")
    args = parser.parse_args(argv)
    check_paired_options(parser, args)
    try:
        result = anyio.run(_run, args)
    except TimeoutError:
        print(f"tracing overhead: the run did not finish within {args.timeout:g} s (--timeout)", file=sys.stderr)
        return 1
    m = result["machine"]
    print(
        f"tracing overhead: {args.calls} calls per variant after {args.warmup} warm-up, blocks of {args.block}; "
        f"{m['cpus']} CPUs, Python {m['python']}, mcp {m['mcp']}, opentelemetry-sdk {m['opentelemetry-sdk']}, "
        f"load {m['loadavg']}; measured in {result['measure_s']} s"
    )
    print(f"spans received by the OTLP receiver: {result['received']}\n")
    print(
        f"{'variant':<18}{'median ms':>10}{'p95 ms':>9}{'p99 ms':>9}{'x off':>7}{'added ms':>10}"
        f"{'gateway CPU ms/call':>21}{'added CPU ms':>14}"
    )
    for r in result["rows"]:
        print(
            f"{r['variant']:<18}{r['median_ms']:>10.3f}{r['p95_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            f"{r['ratio_vs_off']:>7.3f}{r['added_ms_vs_off']:>+10.3f}"
            f"{r['cpu_ms_per_call']:>21.3f}{r['added_cpu_ms_vs_off']:>+14.3f}"
        )
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
