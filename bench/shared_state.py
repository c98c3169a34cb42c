"""Shared state across replicas: what a global rate limit costs per request, and how fast a change fans out.

    python bench/shared_state.py                 # figures on stdout
    python bench/shared_state.py --rounds 20     # more rounds

It starts a real PostgreSQL (tests/postgres.py: Debian's binaries, fsync off as in the tests) and, when
Debian's `redis-server` and the `redis` client (the `bench` extra) are there, a Redis on a free port of
127.0.0.1. Measured in one process, the variants interleaved in rounds of `--calls` calls so machine
load affects each alike; medians over all calls, and each variant's ratio to the in-process bucket:

1. `RateLimiter.check`: this process's own buckets (what each replica did alone; not global);
2. `SharedRateLimiter.take`: one upsert of the caller's bucket in PostgreSQL (UNLOGGED table,
   `synchronous_commit=off`), the database's clock; what the HTTP guard pays per request, from a
   worker thread (`admit`, measured too);
3. the same token bucket in Redis: one `EVALSHA` of a Lua script (the usual way to make it atomic).

Then the fan-out: replica B listens (`ChangeBus`); replica A disables a tool (one transaction with
its NOTIFY); the time until B's handler has read the new set, median over `--changes` changes.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402

from gateway.config.security import RateLimit  # noqa: E402
from gateway.security.ratelimit import RateLimiter  # noqa: E402
from gateway.state.deployment import SharedState  # noqa: E402
from tests.postgres import start_postgres, stop_postgres  # noqa: E402

LIMIT = RateLimit(per_minute=6_000_000, burst=1_000_000)
"""Never refuses during the run: every call does the whole work of an allowed request."""

REDIS_BUCKET = """
local now = redis.call('TIME')
local t = tonumber(now[1]) + tonumber(now[2]) / 1e6
local b = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local burst, rate = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens = tonumber(b[1]) or burst
local stamp = tonumber(b[2]) or t
tokens = math.min(burst, tokens + (t - stamp) * rate)
local taken = 0
if tokens >= 1 then tokens = tokens - 1; taken = 1 end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(t))
return taken
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_redis(home: Path) -> tuple[subprocess.Popen[bytes], Any] | None:
    """redis-server on a free port (no persistence), and a client; None when either is missing."""
    binary = shutil.which("redis-server")
    try:
        import redis
    except ImportError:
        return None
    if binary is None:
        return None
    port = _free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(home)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            return process, client
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                process.kill()
                raise
            time.sleep(0.05)


def timed_calls(work: Callable[[], Any], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        work()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


async def timed_async(work: Callable[[], Any], calls: int) -> list[float]:
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        await work()
        samples.append((time.perf_counter() - started) * 1e6)
    return samples


async def fan_out(first: SharedState, second: SharedState, changes: int) -> list[float]:
    """Milliseconds from A's disable (committed with its NOTIFY) to B's handler having read it."""
    seen: dict[str, float] = {}
    arrived = anyio.Event()

    async def read() -> None:
        nonlocal arrived
        for name in await anyio.to_thread.run_sync(second.switches.disabled, "tools"):
            if name not in seen:
                seen[name] = time.perf_counter()
                arrived.set()

    second.bus.subscribe("tools", read)
    times = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(second.bus.run)
        while second.bus.heard == 0:
            await anyio.to_thread.run_sync(first.bus.publish, "flush")
            await anyio.sleep(0.05)
        for index in range(changes):
            arrived = anyio.Event()
            name = f"bench__tool_{index}"
            started = time.perf_counter()
            await anyio.to_thread.run_sync(first.switches.set_enabled, "tools", name, False, "bench")
            with anyio.fail_after(10):
                await arrived.wait()
            times.append((seen[name] - started) * 1000)
        tg.cancel_scope.cancel()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200, help="calls per variant per round")
    parser.add_argument("--changes", type=int, default=50)
    args = parser.parse_args()
    postgres = start_postgres(Path(tempfile.mkdtemp(prefix="bench-shared-pg-")))  # stop_postgres removes it
    redis_home = Path(tempfile.mkdtemp(prefix="bench-shared-redis-"))
    redis_server = start_redis(redis_home)
    url = postgres.url_with_password()
    first, second = SharedState.connect(url, "a", 600), SharedState.connect(url, "b", 600)
    try:
        local = RateLimiter()
        variants: dict[str, Callable[[], Any]] = {
            "in-process bucket (per replica, not global)": lambda: local.check("k", LIMIT),
            "PostgreSQL upsert (SharedRateLimiter.take)": lambda: first.limiter.take("k", LIMIT),
        }
        if redis_server is not None:
            client = redis_server[1]
            script = client.register_script(REDIS_BUCKET)
            rate = LIMIT.per_minute / 60
            variants["Redis EVALSHA (Lua token bucket)"] = lambda: script(keys=["k"], args=[LIMIT.burst, rate])
        samples: dict[str, list[float]] = {name: [] for name in variants}
        samples["PostgreSQL from a worker thread (admit, as the guard)"] = []
        cpu: dict[str, float] = dict.fromkeys(samples, 0.0)
        """This process's CPU seconds per variant (the client side: what a replica spends, not the server)."""
        for work in variants.values():
            timed_calls(work, 50)  # warm: connections made, schema migrated, script loaded
        for _ in range(args.rounds):
            for name, work in variants.items():
                started = time.process_time()
                samples[name] += timed_calls(work, args.calls)
                cpu[name] += time.process_time() - started
            started = time.process_time()
            samples["PostgreSQL from a worker thread (admit, as the guard)"] += asyncio.run(
                timed_async(lambda: first.limiter.admit("k", LIMIT), args.calls)
            )
            cpu["PostgreSQL from a worker thread (admit, as the guard)"] += time.process_time() - started
        base = statistics.median(samples["in-process bucket (per replica, not global)"])
        print(
            f"rate limit check, {args.rounds} x {args.calls} calls each (µs): wall median, p95, ratio to "
            "in-process, this process's CPU per call"
        )
        for name, values in samples.items():
            median = statistics.median(values)
            p95 = sorted(values)[int(len(values) * 0.95)]
            per_call = cpu[name] / len(values) * 1e6
            print(f"  {name:55s} median {median:8.1f}  p95 {p95:8.1f}  x{median / base:,.0f}  cpu {per_call:6.1f}")
        if redis_server is None:
            print("  (Redis not measured: needs Debian's redis-server and `pip install redis`)")
        times = asyncio.run(fan_out(first, second, args.changes))
        ordered = sorted(times)
        print(
            f"fan-out of a tool disable to another replica, {args.changes} changes (ms): median "
            f"{statistics.median(times):.1f}, p95 {ordered[int(len(ordered) * 0.95)]:.1f}, max {ordered[-1]:.1f}"
        )
    finally:
        first.close()
        second.close()
        if redis_server is not None:
            redis_server[1].close()
            redis_server[0].terminate()
            redis_server[0].wait(timeout=10)
        stop_postgres(postgres)
        shutil.rmtree(redis_home, ignore_errors=True)


if __name__ == "__main__":
    main()
