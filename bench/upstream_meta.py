"""What each part of a proxied request's `_meta` costs a trivial stdio upstream, in its own CPU.

    python bench/upstream_meta.py --turns 40 --batch 20 --inflight 16

The gateway's requests to an upstream carry more than a direct client's: the 2026-07-28
protocol envelope (protocol version, client info, capabilities) where a direct client did the
handshake, a `progressToken`, and the `io.modelcontextprotocol/logLevel` opt-in. Here one
`tests/servers/demo_server.py stdio` child per variant is called on raw JSON-RPC (no SDK client:
what is sent is exactly what is listed), the variants taking turns every `--batch` rounds of
`--inflight` concurrent `echo` calls, so that a shared machine's noise falls on all alike.
Printed per variant: the child's CPU (utime + stime, `/proc`) per call, and its difference
from the handshake-era call with nothing in `_meta` (what `bench/load.py`'s direct path sends).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.mcp_wire import INITIALIZE, INITIALIZED, MODERN_VERSION  # noqa: E402
from bench.timing import cpu_ms  # noqa: E402
from tests.conftest import DEMO_SERVER  # noqa: E402

ENVELOPE = {
    "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
    "io.modelcontextprotocol/clientInfo": {"name": "mcp-gateway", "version": "0.1.0"},
    "io.modelcontextprotocol/clientCapabilities": {
        "sampling": {},
        "elicitation": {"form": {}, "url": {}},
        "roots": {"listChanged": True},
    },
}
"""What the gateway's SDK client stamps on each request to a 2026-07-28 upstream."""
BARE_ENVELOPE = {**ENVELOPE, "io.modelcontextprotocol/clientCapabilities": {}}
"""The envelope of a client that declares no capabilities: what the envelope's size costs."""
LOG = {"io.modelcontextprotocol/logLevel": "debug"}

VARIANTS: dict[str, tuple[bool, dict[str, Any], bool]] = {
    # name: (2026-07-28, _meta beside the progress token, progress token)
    "handshake": (False, {}, False),
    "handshake+progress": (False, {}, True),
    "handshake+log": (False, LOG, False),
    "modern": (True, ENVELOPE, False),
    "modern-bare": (True, BARE_ENVELOPE, False),
    "modern+progress": (True, ENVELOPE, True),
    "modern+log": (True, {**LOG, **ENVELOPE}, False),
    "modern+log+progress": (True, {**LOG, **ENVELOPE}, True),
}


class Child:
    """One upstream child and the requests in flight on it, answers matched by id."""

    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name, self.process = name, process
        self.modern, self.meta, self.progress = VARIANTS[name]
        self.ids = itertools.count(1)
        self.pending: dict[Any, asyncio.Future[dict[str, Any]]] = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            message = json.loads(line)
            waiter = self.pending.pop(message.get("id"), None)
            if waiter is not None:
                waiter.set_result(message)

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        id_ = f"gw-{next(self.ids)}"
        self.pending[id_] = waiter = asyncio.get_running_loop().create_future()
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode())
        self.process.stdin.write(b"\n")
        answer = await waiter
        if "error" in answer or answer.get("result", {}).get("isError"):
            raise RuntimeError(f"{self.name}: {answer!r:.300}")
        return answer

    async def open(self) -> None:
        if self.modern:
            await self.request("server/discover", {"_meta": ENVELOPE})
            return
        await self.request("initialize", INITIALIZE)
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(INITIALIZED).encode() + b"\n")

    async def call(self, text: str) -> None:
        meta = dict(self.meta)
        if self.progress:
            meta["progressToken"] = f"gw-p{text}"
        params: dict[str, Any] = {"name": "echo", "arguments": {"text": text}}
        if meta:
            params["_meta"] = meta
        await self.request("tools/call", params)


async def _spawn(name: str, children: list[Child]) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(DEMO_SERVER),
        "stdio",
        "--name",
        "demo",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
        limit=1 << 24,
    )
    child = Child(name, process)
    children.append(child)  # stopped by `run` even if it never answers
    await asyncio.wait_for(child.open(), 120)


async def _batch(child: Child, rounds: int, inflight: int) -> None:
    for r in range(rounds):
        await asyncio.gather(*(child.call(f"{r}.{k}") for k in range(inflight)))


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    children: list[Child] = []
    try:
        for name in args.variants:
            await _spawn(name, children)
        for child in children:  # warm-up: imports, caches, the JIT-less interpreter's first paths
            await _batch(child, 20, args.inflight)
        per_turn: dict[str, list[float]] = {c.name: [] for c in children}
        calls = args.batch * args.inflight
        for turn in range(args.turns):
            for child in children if turn % 2 == 0 else reversed(children):
                before = cpu_ms(child.process.pid)
                await _batch(child, args.batch, args.inflight)
                per_turn[child.name].append((cpu_ms(child.process.pid) - before) / calls)
        return per_turn
    finally:
        for child in children:
            if child.process.returncode is None:
                child.process.kill()
                await child.process.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=40, help="turns of every variant (default 40)")
    parser.add_argument("--batch", type=int, default=20, help="rounds of calls per turn (default 20)")
    parser.add_argument("--inflight", type=int, default=16, help="concurrent calls per round (default 16)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds before the run is abandoned")
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants: {', '.join(sorted(unknown))}")
    per_turn = asyncio.run(asyncio.wait_for(run(args), args.timeout))
    # A turn's CPU is counted in clock ticks (10 ms): sum over turns, not a median of coarse ones.
    totals = {name: statistics.fmean(values) for name, values in per_turn.items()}
    base = totals.get("handshake")
    print(f"load average {os.getloadavg()[0]:.2f}; {args.turns} turns x {args.batch * args.inflight} calls")
    print(f"{'variant':<22} {'child CPU ms/call':>18} {'vs handshake':>13}")
    for name, value in totals.items():
        delta = f"{value - base:+.3f}" if base is not None else "-"
        print(f"{name:<22} {value:>18.3f} {delta:>13}")


if __name__ == "__main__":
    main()
