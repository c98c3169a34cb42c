"""Bad input thrown at a running gateway while a well-behaved client calls a tool five times a second.

`python -m bench.abuse` starts `mcp-gateway serve --transport http` (the demo server in memory,
the sql plugin on its demo database, records on), keeps one real SDK client calling `mem__echo`
every 0.2 s, and runs one abuse at a time (issue 33): 1 MB `POST /route` requests, a 200 MB
SQL value, 200 MB tool results from a real HTTP server and a real stdio server
(`tests/servers/big_server.py`), 600 slow connections, results holding a lone surrogate, clients
that hang up on a query that runs until it is stopped (how long it ran on after the hang-up). Per
phase it prints the good client's worst and median latency (the stall), the gateway's peak RSS
growth, and whether the abuse was answered as documented; the idle phase first is the same-run
baseline. At the end, the gateway's resident memory before the abuse and after it, settled:
steady for `SETTLE_SECONDS`, before the abuse only after the router's document session was released
(it holds ~90 MB for `DOCUMENT_SESSION_IDLE_SECONDS` after the catalog is embedded at start). `--max-message-bytes`
sets `GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES` (a huge value: the 200 MB results read whole, as before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.router.embedder import DOCUMENT_SESSION_IDLE_SECONDS
from tests.conftest import NO_EMBEDDINGS, REPO, start_gateway_http, start_script_http, stop_process, write_config
from tests.test_hang_up import HANDSHAKE, call_and_hang_up, locked, slow_sql, wait_until
from tests.test_records import Poisoning

HUGE_QUERY = "please add two integers for me " * 34_000  # 1.05 MB
BIG_SERVER = REPO / "tests" / "servers" / "big_server.py"
RESULT_BYTES = 200_000_000
SETTLE_SECONDS = 5.0


def _status_mb(pid: int, field: str) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith(field)).split()[1]) / 1024


def peak_rss_mb(pid: int) -> float:
    return _status_mb(pid, "VmHWM:")


def rss_mb(pid: int) -> float:
    return _status_mb(pid, "VmRSS:")


async def settled_rss_mb(pid: int, at_least: float) -> float:
    """Resident memory once it held within 2 MB for `SETTLE_SECONDS`, after `at_least` seconds
    (at most two minutes: a gateway that never settles is reported as it is then)."""
    started = time.monotonic()
    samples: list[float] = []
    while time.monotonic() - started < 120:
        samples = [*samples[-int(SETTLE_SECONDS) :], rss_mb(pid)]
        steady = len(samples) > SETTLE_SECONDS and max(samples) - min(samples) < 2
        if steady and time.monotonic() - started >= at_least:
            break
        await anyio.sleep(1)
    return samples[-1]


async def route_1mb(url: str, rounds: int) -> str:
    async with httpx2.AsyncClient(timeout=60) as http:
        for _ in range(rounds):
            answer = await http.post(url.removesuffix("/mcp") + "/route", json={"query": HUGE_QUERY, "k": 3})
        return f"{answer.status_code}, query ranked: {len(answer.json()['query'])} chars"


async def sql_200mb(url: str, rounds: int) -> str:
    async with Client(url) as client:
        for _ in range(rounds):
            result = await client.call_tool("sql__execute_sql", {"sql": "SELECT zeroblob(200000000)", "dry_run": False})
        block = result.content[0]
        return "refused: " + (block.text[-60:] if block.type == "text" else block.type)


async def big_result(url: str, rounds: int, server: str) -> str:
    async with Client(url) as client:
        for _ in range(rounds):
            result = await client.call_tool(f"{server}__big", {"size": RESULT_BYTES})
        block = result.content[0]
        code = (result.meta or {}).get("mcp-gateway/error", {}).get("code")
        return f"{code}: " + (block.text[-70:] if block.type == "text" else block.type)


async def big_http(url: str, rounds: int) -> str:
    return await big_result(url, rounds, "bighttp")


async def big_stdio(url: str, rounds: int) -> str:
    return await big_result(url, rounds, "bigstdio")


async def slow_connections(url: str, rounds: int) -> str:
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    closed = 0
    for _ in range(rounds):
        streams: list[anyio.abc.SocketStream] = []
        for index in range(600):
            stream = await anyio.connect_tcp("127.0.0.1", port)
            if index % 2:
                await stream.send(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            streams.append(stream)
        started = time.monotonic()
        for stream in streams:
            try:
                while await stream.receive():
                    pass
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionResetError):
                closed += 1
            await stream.aclose()
        elapsed = time.monotonic() - started
    return f"{closed} of {600 * rounds} closed, the last {elapsed:.1f} s after opening"


async def poison(url: str, rounds: int) -> str:
    async with (
        httpx2.AsyncClient(transport=Poisoning(), timeout=20) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        for _ in range(rounds * 10):
            try:
                await client.call_tool("mem__echo", {"text": "POISON"})
            except MCPError:
                pass  # the answer holds the surrogate: the SDK's client cannot parse it
    return f"{rounds * 10} results with a lone surrogate"


async def hung_up_queries(url: str, rounds: int, database: Path) -> str:
    """Each round: a query that runs until it is stopped, its client gone once it holds the database."""
    ran_on = []
    for index in range(rounds):
        arguments = {"sql": slow_sql(index, "customers"), "dry_run": False, "timeout_ms": 60_000}
        hung_up = await call_and_hang_up(url, HANDSHAKE, "sql__execute_sql", arguments, lambda: locked(database))
        ran_on.append(await wait_until(lambda: not locked(database), within=70) - hung_up)
    return f"stopped {max(ran_on) * 1000:.0f} ms after the hang-up at worst (limit 60 s)"


PHASES: dict[str, Callable[[str, int], Awaitable[str]]] = {
    "1 MB POST /route (x3)": route_1mb,
    "SELECT zeroblob(200000000) (x3)": sql_200mb,
    "200 MB tool result, HTTP server (x3)": big_http,
    "200 MB tool result, stdio server (x3)": big_stdio,
    "600 slow connections": slow_connections,
    "lone surrogates (x30)": poison,
}


async def main(header_timeout: float, max_message_bytes: int | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        big, big_url = start_script_http([str(BIG_SERVER), "--port", "0"])
        config = write_config(
            root / "gw.yaml",
            "plugins:\n  sql:\n    database: shop.sqlite\n    demo: true\n"
            f"mcps:\n  bighttp:\n    url: {big_url}\n"
            f"  bigstdio:\n    command: {sys.executable}\n    args: ['{BIG_SERVER}']\n",
        )
        env = NO_EMBEDDINGS | {
            "GATEWAY_EMBEDDING__ENABLED": "true",
            "GATEWAY_PLUGINS__DIRECTORY": str(REPO / "plugins"),
            "GATEWAY_PLUGINS__ALLOW": json.dumps(["sql"]),
            "GATEWAY_HTTP__HEADER_TIMEOUT": str(header_timeout),
            "GATEWAY_HTTP__MAX_CONNECTIONS_PER_CLIENT": "2000",
        }
        if max_message_bytes is not None:
            env["GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES"] = str(max_message_bytes)
        process, url = start_gateway_http(config, root, env)
        rows = []
        try:
            async with Client(url) as good:
                latencies: list[float] = []
                stop = anyio.Event()

                async def keep_calling() -> None:
                    while not stop.is_set():
                        started = time.perf_counter()
                        await good.call_tool("mem__echo", {"text": "good"})
                        latencies.append((time.perf_counter() - started) * 1000)
                        await anyio.sleep(max(0.0, 0.2 - (time.perf_counter() - started)))

                async with anyio.create_task_group() as tg:
                    tg.start_soon(keep_calling)
                    async with httpx2.AsyncClient(timeout=60) as http:  # warm up: the router's model loaded
                        for _ in range(3):
                            await http.post(url.removesuffix("/mcp") + "/route", json={"query": "add two integers"})
                    settled_before = await settled_rss_mb(process.pid, DOCUMENT_SESSION_IDLE_SECONDS + 15)
                    hung_up = partial(hung_up_queries, database=root / "data" / "shop.sqlite")
                    phases = [*PHASES.items(), ("hung-up slow queries (x3)", hung_up)]
                    for name, phase in [("idle (baseline)", None), *phases]:
                        latencies.clear()
                        before = peak_rss_mb(process.pid)
                        outcome = "-" if phase is None else await phase(url, 1 if "slow" in name else 3)
                        if phase is None:
                            await anyio.sleep(3)
                        await anyio.sleep(0.5)
                        grown = peak_rss_mb(process.pid) - before
                        rows.append((name, max(latencies), statistics.median(latencies), grown, outcome))
                    settled_after = await settled_rss_mb(process.pid, SETTLE_SECONDS)
                    stop.set()
        finally:
            stop_process(process)
            stop_process(big)
    baseline = rows[0][1]
    print("| abuse | good client's worst call (ms) | ratio to idle | median (ms) | peak RSS growth (MB) | answered |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, worst, median, grown, outcome in rows:
        print(f"| {name} | {worst:.0f} | {worst / baseline:.1f}x | {median:.0f} | {grown:.0f} | {outcome} |")
    print(
        f"\nresident memory, settled ({SETTLE_SECONDS:g} s steady): {settled_before:.0f} MB before the abuse, "
        f"{settled_after:.0f} MB after it ({settled_after / settled_before:.2f}x)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--header-timeout", type=float, default=2.0, help="GATEWAY_HTTP__HEADER_TIMEOUT")
    parser.add_argument("--max-message-bytes", type=int, help="GATEWAY_UPSTREAMS__MAX_MESSAGE_BYTES")
    arguments = parser.parse_args()
    anyio.run(main, arguments.header_timeout, arguments.max_message_bytes)
