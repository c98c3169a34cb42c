"""Gateway CPU per call of a few gateway variants, taking turns every 10 calls (HTTP or stdio).

    python bench/interleaved_cpu.py --transport http \\
        --gateway-checkout h11=.,GATEWAY_HTTP__PARSER=h11,GATEWAY_HTTP__EVENT_LOOP=asyncio \\
        --gateway-checkout fast=.

Where `bench/load.py` rotates its paths every cell (seconds), this rotates them every batch of
`--batch` calls over `--sessions` concurrent sessions, so that a shared machine's noise falls on
every variant alike even when it changes from second to second (a turn of every path must stay
within the gateway's keep-alive timeout, `GATEWAY_HTTP__IDLE_TIMEOUT`, 5 s). Each variant is a `gateway@NAME`
path of `bench/load_targets.py` (a checkout, with settings of its own), in front of the one
trivial upstream, which `direct` also calls. Printed per path: CPU per call of its hop (the
gateway's; the upstream's for `direct`), of the upstream behind it, their ratio, and wall time
per call.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.load_targets import Processes, Target, add_checkout_option, start_targets  # noqa: E402
from bench.mcp_wire import Session  # noqa: E402
from bench.timing import cpu_ms  # noqa: E402


async def _batch(target: Target, sessions: list[Session], calls: int, tag: str) -> None:
    for i in range(calls):
        await asyncio.gather(*(s.call(target.tool, {"text": f"{tag} {i}"}) for s in sessions))


async def run(args: argparse.Namespace) -> None:
    checkouts = dict(args.gateway_checkout)
    paths = ["direct", *(f"gateway@{name}" for name in checkouts)]
    processes = Processes()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            targets = await start_targets([args.transport], paths, Path(tmp), processes, checkouts)
            opened: list[tuple[Target, list[Session]]] = []
            for target in targets:
                sessions = [target.new_session() for _ in range(args.sessions)]
                for session in sessions:
                    await session.open()
                opened.append((target, sessions))
            for turn in range(5):  # warm-up turns, unmeasured; no connection idles past the keep-alive timeout
                for target, sessions in opened:
                    await _batch(target, sessions, args.batch, f"warm{turn}")
            hop = {t.path: 0.0 for t, _ in opened}
            upstream = {t.path: 0.0 for t, _ in opened}
            wall = {t.path: 0.0 for t, _ in opened}
            for turn in range(args.turns):
                for target, sessions in opened if turn % 2 == 0 else reversed(opened):
                    role = "gateway" if "gateway" in target.roles else "upstream"
                    hop0, up0 = cpu_ms(target.roles[role]), cpu_ms(target.roles["upstream"])
                    started = time.perf_counter()
                    await _batch(target, sessions, args.batch, f"t{turn}")
                    wall[target.path] += time.perf_counter() - started
                    hop[target.path] += cpu_ms(target.roles[role]) - hop0
                    upstream[target.path] += cpu_ms(target.roles["upstream"]) - up0
            calls = args.turns * args.batch * args.sessions
            print(f"{args.transport}, {args.sessions} session(s), {calls} calls a path; load {os.getloadavg()[0]:.1f}")
            for path in hop:
                print(
                    f"  {path:22s} hop CPU/call {hop[path] / calls:6.3f} ms  upstream {upstream[path] / calls:6.3f} ms"
                    f"  ratio {hop[path] / max(upstream[path], 1e-9):5.2f}"
                    f"  wall/call {wall[path] / (args.turns * args.batch) * 1000:6.2f} ms"
                )
            for _, sessions in opened:
                await asyncio.gather(*(s.close() for s in sessions))
        finally:
            await processes.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transport", choices=("http", "stdio"), default="http")
    parser.add_argument("--sessions", type=int, default=1, help="concurrent sessions a path (1)")
    parser.add_argument("--batch", type=int, default=10, help="calls a turn (10)")
    parser.add_argument("--turns", type=int, default=100, help="turns a path (100)")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run, seconds (600)")
    add_checkout_option(parser, "a gateway variant: NAME=DIR[,GATEWAY_X=value...] (repeatable)")
    args = parser.parse_args()
    if not args.gateway_checkout:
        parser.error("give at least one --gateway-checkout")
    asyncio.run(asyncio.wait_for(run(args), args.timeout))


if __name__ == "__main__":
    main()
