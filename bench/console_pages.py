"""The operator console under load: page render times with 100,000 records in the store, and the live
tail's lag while clients make 200 calls a second.

One gateway runs in this process, in front of in-memory demo servers, with records on (SQLite in a
temporary data dir) and no authentication (the console is open on loopback).

- pages: the store is first filled with `--records` executions through the records writer (the same
  path calls take), spread evenly over `--hours` (so the overview's 15-minute window holds its share),
  with some errors and some feedback. Each console page is then requested `--reps` times through the
  whole HTTP app (guard, console session check, views, Jinja2) over an in-process ASGI transport; the
  baseline is `GET /healthz` through the same app, measured in the same rounds.
- tail: the gateway serves HTTP on a free port on 127.0.0.1 with uvicorn, and `--rate` calls a second
  are made through the SDK's client (in memory, in this process) in blocks of `--seconds`, taking
  turns `--rounds` times: with no tail open (the baseline), and while a reader in another process
  follows `GET /admin/calls/stream` (server-sent events) over a real socket. A call's lag is when its
  event reached the reader minus when the call completed (its start plus its latency, as recorded;
  one clock, one machine).

    python bench/console_pages.py    # 100,000 records, 30 reps, 3 x 2 blocks of 5 s at 200 calls/s
    python bench/console_pages.py --records 10000 --reps 10 --seconds 2 --rounds 1 --json
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

import anyio
import httpx2
import mcp_types as types
from mcp import Client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from timing import percentile  # noqa: E402

from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.records.model import FEEDBACK_TOKEN_META_KEY, PendingExecution  # noqa: E402
from gateway.records.service import Records, open_store  # noqa: E402
from gateway.registry import Registry  # noqa: E402
from gateway.router.service import RouterService, build_router  # noqa: E402
from gateway.serving.admin.ui import console_tail  # noqa: E402
from gateway.serving.http import bind_socket, build_http_app, serve_http  # noqa: E402
from gateway.serving.server import GatewayServer  # noqa: E402
from gateway.upstreams.upstream import UpstreamSpec  # noqa: E402
from tests.servers.demo_server import create_server  # noqa: E402

SERVERS = 5
PAGES = (
    ("overview", "/admin"),
    ("server", "/admin/servers/mem0"),
    ("tools", "/admin/tools"),
    ("tools+playground", "/admin/tools?search=add+two+numbers&k=8"),
    ("try a tool", "/admin/try"),
    ("calls", "/admin/calls"),
    ("calls, filtered", "/admin/calls?server=mem3&status=error"),
    ("call detail", "/admin/calls/{execution}"),
    ("feedback", "/admin/feedback"),
    ("config", "/admin/config"),
    ("audit", "/admin/audit"),
)


def fill(records: Records, count: int, hours: float) -> str:
    """Submit `count` executions spread over the last `hours` through the records' writer; return one id."""
    rng = random.Random(18)
    now = time.time()
    span = hours * 3600
    ok = types.CallToolResult(content=[types.TextContent(type="text", text="echo: hello there")])
    bad = types.CallToolResult(content=[types.TextContent(type="text", text="it broke")], is_error=True)
    last = ""
    for index in range(count):
        server = f"mem{index % SERVERS}"
        tool = rng.choice(("echo", "add", "fail", "sleep"))
        last = uuid.uuid4().hex
        record = PendingExecution(
            id=last,
            at=now - span + span * index / count,
            server=server,
            tool=f"{server}__{tool}",
            session_id=None,
            client_id=rng.choice(("app", "agent", None)),
            arguments={"text": "hello there", "n": index},
            latency_ms=rng.lognormvariate(1.0, 0.6),
            attempts=1,
            search_id=None,
            result=bad if tool == "fail" else ok,
        )
        while records.writer.pending >= 2000:
            time.sleep(0.01)  # the writer's thread catches up: nothing is dropped
        records.submit_execution(record)
    return last


async def rate_some(records: Records, client: Client, count: int) -> None:
    """Real calls with real feedback, so the feedback page and a call's detail have some."""
    from gateway.records.feedback import parse_feedback, submit_feedback

    for index in range(count):
        result = await client.call_tool("mem0__echo", {"text": f"rated {index}"})
        token = (result.meta or {})[FEEDBACK_TOKEN_META_KEY]
        await records.flush()  # the call's record written before it is rated (not what is measured here)
        feedback = parse_feedback({"token": token, "rating": "up", "score": 4, "comment": "fine"})
        await submit_feedback(records, feedback, may_see=lambda _: True, client_id="bench")


async def pages(gateway: GatewayServer, settings: Settings, execution: str, reps: int) -> dict[str, Any]:
    app = build_http_app(gateway, settings)
    transport = httpx2.ASGITransport(app=app)
    paths = [("baseline /healthz", "/healthz")] + [(name, path.format(execution=execution)) for name, path in PAGES]
    samples: dict[str, list[float]] = {name: [] for name, _ in paths}
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as http:  # Host with a port
        for name, path in paths:  # warm: templates compiled, caches filled
            response = await http.get(path)
            if response.status_code != 200:
                raise RuntimeError(f"{name}: GET {path} answered {response.status_code}: {response.text[:300]}")
        for _ in range(reps):  # rounds: every page once per round, so noise falls on all of them
            for name, path in paths:
                started = time.perf_counter()
                response = await http.get(path)
                samples[name].append((time.perf_counter() - started) * 1000)
                assert response.status_code == 200
    base = statistics.median(samples["baseline /healthz"])
    return {
        name: {
            "median_ms": round(statistics.median(values), 2),
            "p90_ms": round(percentile(sorted(values), 90), 2),
            "ratio_to_baseline": round(statistics.median(values) / base, 1),
        }
        for name, values in samples.items()
    }


def read_tail(url: str, out: Path) -> None:
    """The reader, in its own process: one line per event, `id arrival at latency_ms`, flushed at once."""
    with httpx2.Client(timeout=None) as http, http.stream("GET", url) as response, out.open("w") as sink:
        sink.write("open\n")
        sink.flush()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                sink.write(f"{event['id']} {time.time()} {event['at']} {event['latency_ms']}\n")
                sink.flush()


async def load(client: Client, rate: float, seconds: float) -> tuple[list[str], float, list[float]]:
    """`rate` calls a second for `seconds`, each started on time whatever the others do; returns the
    execution ids, the seconds it took and each call's latency in ms."""
    sent: list[str] = []
    latencies: list[float] = []

    async def call(index: int) -> None:
        started = time.perf_counter()
        result = await client.call_tool("mem1__echo", {"text": f"tail {index}"})
        latencies.append((time.perf_counter() - started) * 1000)
        sent.append((result.meta or {})[FEEDBACK_TOKEN_META_KEY])

    begin = time.perf_counter()
    async with anyio.create_task_group() as calls:
        for index in range(int(rate * seconds)):
            delay = begin + index / rate - time.perf_counter()
            if delay > 0:
                await anyio.sleep(delay)
            calls.start_soon(call, index)
    return sent, time.perf_counter() - begin, latencies


def _events(path: Path) -> dict[str, float]:
    """Lag in ms by execution id, from the reader's lines: arrival minus the call's completion."""
    lags = {}
    for line in path.read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 4:
            execution, arrived, at, latency = parts[0], float(parts[1]), float(parts[2]), float(parts[3])
            lags[execution] = (arrived - at - latency / 1000) * 1000
    return lags


async def tail_lag(
    gateway: GatewayServer, settings: Settings, rate: float, seconds: float, rounds: int
) -> dict[str, Any]:
    """Blocks of calls at `rate`, taking turns: with no tail open (the baseline), and with a reader
    process following the tail (started afresh for each block); figures are medians over blocks."""
    sock = bind_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    stop, started = anyio.Event(), anyio.Event()
    folder = Path(tempfile.mkdtemp(prefix="console-tail-"))
    blocks: dict[str, list[tuple[float, float]]] = {"baseline": [], "with_tail": []}
    lags: list[float] = []
    sent_all = received_all = 0
    tail = console_tail(gateway)
    dropped_before = tail.dropped
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: serve_http(gateway, settings, sock, stop=stop, ready=lambda _: started.set()))
        await started.wait()
        async with Client(gateway.server) as client:
            for index in range(rounds):
                _, elapsed, latencies = await load(client, rate, seconds)
                blocks["baseline"].append((int(rate * seconds) / elapsed, statistics.median(latencies)))
                out = folder / f"events-{index}.txt"
                after = tail.recent[-1].seq if tail.recent else 0  # only the calls from now on
                url = f"http://127.0.0.1:{port}/admin/calls/stream?after={after}"
                reader = await anyio.open_process([sys.executable, __file__, "--read-tail", url, "--out", str(out)])
                try:
                    with anyio.fail_after(30):
                        while not out.exists() or not out.read_text().startswith("open"):
                            await anyio.sleep(0.05)
                    sent, elapsed, latencies = await load(client, rate, seconds)
                    with anyio.move_on_after(10):
                        while not set(_events(out)).issuperset(sent):
                            await anyio.sleep(0.05)
                finally:
                    reader.terminate()
                    await reader.wait()
                blocks["with_tail"].append((len(sent) / elapsed, statistics.median(latencies)))
                found = _events(out)
                lags += [found[e] for e in sent if e in found]
                sent_all += len(sent)
                received_all += sum(1 for e in sent if e in found)
        stop.set()
    ordered = sorted(lags)
    result: dict[str, Any] = {
        key: {
            "achieved_rate": round(statistics.median(rate for rate, _ in values), 1),
            "call_p50_ms": round(statistics.median(p50 for _, p50 in values), 2),
        }
        for key, values in blocks.items()
    }
    result["with_tail"].update(
        calls=sent_all,
        received=received_all,
        dropped=tail.dropped - dropped_before,
        lag_p50_ms=round(percentile(ordered, 50), 2),
        lag_p99_ms=round(percentile(ordered, 99), 2),
        lag_max_ms=round(ordered[-1], 2) if ordered else None,
    )
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    logging.basicConfig(level=logging.WARNING)
    data = Path(tempfile.mkdtemp(prefix="console-bench-"))
    settings = Settings(data_dir=data, embedding=EmbeddingSettings(enabled=False))
    specs = [
        UpstreamSpec(id=f"mem{i}", prefix=f"mem{i}", transport="memory", target=create_server(f"mem{i}"))
        for i in range(SERVERS)
    ]
    registry = Registry(specs, settings)
    records = Records(settings.records, open_store(settings), registry.redact)
    registry.record_calls(records.recorder)
    async with registry.running(), records.running():
        router = RouterService(registry, settings, lambda: build_router(settings, None))
        registry.task_group.start_soon(router.run)
        await registry.wait_settled()
        await router.complete.wait()
        gateway = GatewayServer(registry, settings, router, records=records)
        filled = time.perf_counter()
        execution = await anyio.to_thread.run_sync(fill, records, args.records, args.hours)
        await records.flush()
        if records.writer.dropped:
            raise RuntimeError(f"the writer dropped {records.writer.dropped} of the records filled in")
        async with Client(gateway.server) as client:
            await rate_some(records, client, 200)
        await records.flush()
        fill_seconds = time.perf_counter() - filled
        rendered = await pages(gateway, settings, execution, args.reps)
        tail = await tail_lag(gateway, settings, args.rate, args.seconds, args.rounds)
        registry.task_group.cancel_scope.cancel()
    return {
        "records": args.records,
        "hours": args.hours,
        "in_15_min_window": round(args.records * 0.25 / args.hours),
        "fill_seconds": round(fill_seconds, 1),
        "reps": args.reps,
        "pages": rendered,
        "tail": tail,
        "python": platform.python_version(),
    }


def report(result: dict[str, Any]) -> None:
    print(
        f"{result['records']:,} records over {result['hours']} h (~{result['in_15_min_window']:,} in the overview's "
        f"15-minute window), filled in {result['fill_seconds']} s; {result['reps']} rounds"
    )
    print(f"{'page':<20} {'median ms':>10} {'p90 ms':>8} {'x /healthz':>11}")
    for name, figures in result["pages"].items():
        print(f"{name:<20} {figures['median_ms']:>10} {figures['p90_ms']:>8} {figures['ratio_to_baseline']:>11}")
    base, tail = result["tail"]["baseline"], result["tail"]["with_tail"]
    print(f"calls, no tail open (baseline): {base['achieved_rate']}/s, call p50 {base['call_p50_ms']} ms")
    print(
        f"calls with the tail open:       {tail['achieved_rate']}/s, call p50 {tail['call_p50_ms']} ms; "
        f"{tail['received']} of {tail['calls']} received, {tail['dropped']} dropped; "
        f"lag p50 {tail['lag_p50_ms']} ms, p99 {tail['lag_p99_ms']} ms, max {tail['lag_max_ms']} ms"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--hours", type=float, default=24.0, help="the span the records are spread over")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--rate", type=float, default=200.0, help="calls per second for the tail")
    parser.add_argument("--seconds", type=float, default=5.0, help="of one block of calls")
    parser.add_argument("--rounds", type=int, default=3, help="blocks with and without the tail open, each")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--read-tail", metavar="URL", help=argparse.SUPPRESS)  # the reader process
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.read_tail:
        read_tail(options.read_tail, options.out)
        sys.exit(0)
    outcome = anyio.run(main, options)
    print(json.dumps(outcome, indent=2)) if options.json else report(outcome)
