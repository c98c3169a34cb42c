"""What the operator console costs: a proxied call with and without the admin surface mounted, and the
admin API's reads with 100,000 records in the store.

    python bench/admin_overhead.py                 # 2000 measured calls per variant, 100,000 records
    python bench/admin_overhead.py --calls 500 --records 20000 --json

1. **A proxied call.** One process, one registry (the demo server in memory, tool `mem__echo`, records
   on), two HTTP apps served by uvicorn on 127.0.0.1: `build_http_app(admin=True)` (as `serve` runs
   it: the console's routes, its ASGI wrapper, the guard's session prefix) and `admin=False`. The
   SDK's `Client` calls each over streamable HTTP; after a warm-up the two take turns in blocks of
   calls, the order alternating, so the machine's noise falls on both alike. Printed: the median and
   p90 of each, the ratio of medians, and the median over blocks of the difference of block medians.
2. **Reads with N records.** The store is filled with N executions (10 servers, 5 tools each, 5 %
   errors, 1 % refused) spread over the last 24 hours, then each read is timed through HTTP
   (`GET /admin/api/v1/...` with an admin key) and the overview in process (`views.overview`); the
   median of repeated requests. A second fill puts N executions in the last 15 minutes: the
   overview's window then holds them all (it reads at most 50,000).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402
import httpx2  # noqa: E402
import uvicorn  # noqa: E402
from mcp import Client  # noqa: E402
from timing import paired_added, percentile, timed  # noqa: E402

from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.config.runtime_settings import RecordsSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.records.service import Records, open_store  # noqa: E402
from gateway.records.store import Batch  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.serving.admin import views  # noqa: E402
from gateway.serving.http import bind_socket, build_http_app  # noqa: E402
from gateway.serving.server import GatewayServer  # noqa: E402
from gateway.upstreams.upstream import UpstreamSpec  # noqa: E402
from tests.servers.demo_server import create_server  # noqa: E402

for noisy in ("gateway", "httpx", "httpx2", "mcp"):
    logging.getLogger(noisy).setLevel(logging.WARNING)
BLOCK = 50


def fill(store: Any, n: int, span: float, now: float) -> None:
    """N executions over the last `span` seconds, in batches (as the writer writes them)."""
    rng = random.Random(7)
    batch = Batch()
    for i in range(n):
        server = f"s{i % 10}"
        roll = rng.random()
        status, code, attempts = ("success", None, 1)
        if roll < 0.05:
            status, code = "error", "tool_error"
        elif roll < 0.06:
            status, code, attempts = "error", "tool_not_found", 0
        batch.executions.append(
            (
                uuid.uuid4().hex,
                now - rng.random() * span,
                server,
                f"{server}__tool{rng.randrange(5)}",
                None,
                "bench",
                '{"q": "x"}',
                "result text",
                11,
                rng.lognormvariate(2, 0.5),
                status,
                code,
                attempts,
                None,
                None,
            )
        )
        if len(batch.executions) == 5000:
            store.write(batch)
            batch = Batch()
    if batch.executions:
        store.write(batch)


async def serve(app: Any, sock: Any, tg: Any) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    tg.start_soon(server.serve, [sock])
    while not server.started:
        await anyio.sleep(0.01)
    return server


async def median_ms(request: Any, repeat: int) -> float:
    samples = await timed(request, repeat)
    return statistics.median(samples) / 1000


async def main(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="admin-bench-"))
    settings = Settings(
        data_dir=tmp,
        embedding=EmbeddingSettings(enabled=False),
        records=RecordsSettings(flush_interval=0.5),
    )
    spec = UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))
    registry = Registry([spec], settings)
    records = Records(settings.records, open_store(settings), registry.redact)
    registry.record_calls(records.recorder)
    out: dict[str, Any] = {"calls": args.calls, "records": args.records, "python": platform.python_version()}
    async with registry.running(), records.running(), anyio.create_task_group() as tg:
        await registry.wait_settled(30)
        with_admin = GatewayServer(registry, settings, records=records)
        without = GatewayServer(registry, settings, records=records)
        servers, urls = [], {}
        for name, gateway, admin in (("with admin", with_admin, True), ("without admin", without, False)):
            sock = bind_socket("127.0.0.1", 0)
            servers.append(await serve(build_http_app(gateway, settings, admin=admin), sock, tg))
            urls[name] = f"http://127.0.0.1:{sock.getsockname()[1]}"

        # 1. a proxied call, interleaved
        samples: dict[str, list[float]] = {name: [] for name in urls}
        async with Client(urls["with admin"] + "/mcp") as a, Client(urls["without admin"] + "/mcp") as b:
            clients = {"with admin": a, "without admin": b}
            works = {name: (lambda c=c: c.call_tool("mem__echo", {"text": "hello"})) for name, c in clients.items()}
            for work in works.values():
                await timed(work, 200)
            names = list(works)
            for r in range(args.calls // BLOCK):
                for name in names if r % 2 == 0 else list(reversed(names)):
                    samples[name] += [s / 1000 for s in await timed(works[name], BLOCK)]
        base = samples["without admin"]
        calls_out = {}
        for name, values in samples.items():
            ordered = sorted(values)
            calls_out[name] = {
                "median_ms": round(statistics.median(values), 3),
                "p90_ms": round(percentile(ordered, 90), 3),
                "ratio": round(statistics.median(values) / statistics.median(base), 3),
                "added_ms": round(paired_added(values, base, BLOCK), 3),
            }
        out["proxied_call"] = calls_out

        # 2. reads with N records
        api = urls["with admin"] + "/admin/api/v1"
        reads: dict[str, Any] = {}
        async with httpx2.AsyncClient(timeout=60) as http:
            for label, span in (("spread over 24 h", 86400.0), ("all in the last 15 min", 600.0)):
                await records.flush()
                await anyio.to_thread.run_sync(records.store.run, "DELETE FROM executions")
                started = time.perf_counter()
                await anyio.to_thread.run_sync(fill, records.store, args.records, span, time.time())
                filled = time.perf_counter() - started
                first = (await http.get(api + "/calls", params={"limit": 100})).json()
                before = first["next_before"]
                requests = {
                    "GET calls (latest 100)": {"limit": 100},
                    "GET calls?server=s3": {"server": "s3"},
                    "GET calls?tool=s3__tool1&status=ok": {"tool": "s3__tool1", "status": "ok"},
                    "GET calls?status=error": {"status": "error"},
                    "GET calls?status=refused": {"status": "refused"},
                    "GET calls?since=1h": {"since": "1h"},
                    "GET calls (page 2, before=)": {"limit": 100, "before": before},
                }
                timings = {}
                for what, params in requests.items():

                    async def get(params: dict[str, Any] = params) -> None:
                        response = await http.get(api + "/calls", params=params)
                        assert response.status_code == 200, response.text

                    timings[what] = round(await median_ms(get, args.repeat), 2)

                async def get_servers() -> None:
                    assert (await http.get(api + "/servers")).status_code == 200

                async def overview() -> None:
                    await views.overview(with_admin)

                timings["GET servers (figures of the window)"] = round(await median_ms(get_servers, args.repeat), 2)
                timings["views.overview (in process)"] = round(await median_ms(overview, args.repeat), 2)
                reads[label] = {"fill_s": round(filled, 1), "ms": timings}
        out["reads"] = reads
        for server in servers:
            server.should_exit = True  # the task group then waits for both to shut down
    return out


def report(out: dict[str, Any]) -> None:
    print(f"proxied call mem__echo over streamable HTTP, {out['calls']} calls per variant, blocks of {BLOCK}:")
    for name, row in out["proxied_call"].items():
        print(
            f"  {name:<14} median {row['median_ms']:.3f} ms  p90 {row['p90_ms']:.3f} ms  "
            f"ratio {row['ratio']:.3f}  added {row['added_ms']:+.3f} ms"
        )
    for label, block in out["reads"].items():
        print(f"{out['records']:,} records, {label} (filled in {block['fill_s']} s), median of repeated requests:")
        for what, ms in block["ms"].items():
            print(f"  {what:<40} {ms:8.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    arguments = parser.parse_args()
    figures = anyio.run(main, arguments)
    report(figures)
    if arguments.json:
        print(json.dumps(figures))
