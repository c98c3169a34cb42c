"""Load generator: N concurrent sessions of tool calls, direct, through the gateway, through FastMCP's proxy.

Paths, each to the same trivial upstream (`tests/servers/demo_server.py`, tool `echo`):

- direct:   the client talks to the upstream itself
- gateway:  `python -m gateway serve` (BM25 only, `GATEWAY_EMBEDDING__ENABLED=false`) with the
            upstream in its YAML config, tool `up__echo`
- fastmcp:  `bench/fastmcp_proxy.py`, FastMCP's `create_proxy` over one connected upstream
            session (its fast mode); `fastmcp-fresh` (not in the default run): FastMCP's
            default, a new upstream session per request
- gateway@NAME: the gateway of another checkout (`--gateway-checkout NAME=DIR`), in the same
            run, to measure a change against its base; `NAME=DIR,GATEWAY_X=value,...` runs it
            with those settings (e.g. `h11=.,GATEWAY_HTTP__PARSER=h11`)

over both transports:

- http:  streamable HTTP. The upstream is one `demo_server.py http` process shared by all
         the paths; the gateway and the proxy reach it over HTTP. A session is one
         keep-alive TCP connection (TCP_NODELAY) with its own `Mcp-Session-Id`, opened with
         the `initialize` / `notifications/initialized` handshake, then calling `tools/call`
         one call after another. N sessions = N connections, N calls in flight.
- stdio: each path is one child process spoken to over its stdin/stdout (newline-delimited
         JSON-RPC): the upstream itself, the gateway with the upstream as its stdio child, or
         the proxy with the upstream as its stdio child. N sessions = N requests outstanding
         at once on that one stdio connection (one MCP session), each answered before its
         "session" sends the next; one process per session would measure process startup.

The client is hand-written on asyncio (`bench/mcp_wire.py`: raw sockets and pipes, a few
lines of HTTP/1.1 and SSE parsing, `json`), so that it costs little of the CPU it
measures: httpx or the SDK's client would use most of a core by themselves.

For each level of concurrency (`--levels`) the paths take turns, the order rotated every
level and every round (`--rounds`), so the machine's noise falls on all of them alike. A
cell opens N sessions, makes one unmeasured call on each, then calls for `--seconds` and
reports calls/s, p50 and p99 latency, errors, and the CPU milliseconds per call of every
process involved: the load generator itself, the gateway, the proxy, the upstream (for the
stdio paths, the child of the gateway or the proxy), each read from `/proc/<pid>/stat`
(utime + stime) before and after the window. After the table, same-run ratios: for each
path and level the median over rounds of its calls/s against direct's and FastMCP's in the
same round, and of its hop's CPU per call (gateway or proxy) against the upstream's own CPU
per call on the direct path.

`--soak SECONDS` instead calls the gateway at a steady `--rate` for that long and samples
its RSS (`/proc/<pid>/status` VmRSS) and open file descriptors (`/proc/<pid>/fd`) every
`--sample-every` seconds, with the p50 and errors of each interval; it reports the first
sample after `--warmup`, the last, the drift between them and the maximum.

    python bench/load.py                                  # http and stdio, levels 1,10,50,200, 3 s a cell
    python bench/load.py --transports http --levels 1,10 --seconds 2 --json
    python bench/load.py --soak 600 --rate 200
    python bench/load.py --gateway-checkout base=/tmp/gw-base --paths direct,gateway@base,gateway
    python bench/load.py --transports http --upstream-sse --paths gateway,fastmcp   # an HTTP+SSE upstream

Every process it starts is stopped when the run ends, also on error, timeout (`--timeout`)
or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.load_targets import (  # noqa: E402
    QUIET_ENV,
    Checkout,
    Processes,
    Target,
    add_checkout_option,
    open_fds,
    rss_mb,
    start_targets,
)
from bench.mcp_wire import CallError, Session  # noqa: E402
from bench.timing import cpu_ms, percentile  # noqa: E402

PATHS = ("direct", "gateway", "fastmcp", "fastmcp-fresh")
DEFAULT_PATHS = ("direct", "gateway", "fastmcp")
TRANSPORTS = ("http", "stdio")
CALL_TIMEOUT = 30.0


# --- a cell: one target at one level of concurrency --------------------------------------


@dataclass
class Cell:
    transport: str
    path: str
    sessions: int
    calls: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    """Role -> CPU milliseconds over the measured windows."""
    first_error: str = ""
    rounds: list[dict[str, Any]] = field(default_factory=list)
    """Each round's calls/s and CPU milliseconds per call by role, for same-run ratios."""

    def row(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        cpu = self.cpu.items()
        return {
            "transport": self.transport,
            "path": self.path,
            "sessions": self.sessions,
            "calls": self.calls,
            "errors": self.errors,
            "seconds": round(self.seconds, 3),
            "calls_per_s": round(self.calls / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": _ms(percentile(lat, 50)),
            "p95_ms": _ms(percentile(lat, 95)),
            "p99_ms": _ms(percentile(lat, 99)),
            "cpu_total_ms_per_call": round(sum(ms for _, ms in cpu) / self.calls, 3) if self.calls else None,
            "cpu_ms_per_call": {role: round(ms / self.calls, 3) if self.calls else None for role, ms in cpu},
            "first_error": self.first_error,
            "rounds": self.rounds,
        }


def _ms(value: float) -> float | None:
    """Milliseconds rounded to the microsecond; None (JSON null) where there were no calls."""
    return round(value, 3) if value == value else None


def _cpu_snapshot(target: Target) -> dict[str, float]:
    return {"loadgen": cpu_ms(os.getpid())} | {role: cpu_ms(pid) for role, pid in target.roles.items()}


async def _open_sessions(target: Target, n: int, cell: Cell) -> list[Session]:
    sessions = [target.new_session() for _ in range(n)]
    opened: list[Session] = []

    async def open_one(session: Session) -> None:
        try:
            await asyncio.wait_for(session.open(), CALL_TIMEOUT)
            await asyncio.wait_for(session.call(target.tool, {"text": "warm"}), CALL_TIMEOUT)
            opened.append(session)
        except (CallError, OSError, TimeoutError) as exc:
            cell.errors += 1
            cell.first_error = cell.first_error or f"open: {exc!r:.300}"
            await session.close()

    for start in range(0, n, 50):  # at most 50 handshakes at once, as a crowd of agents would not all start at once
        await asyncio.gather(*(open_one(s) for s in sessions[start : start + 50]))
    return opened


async def run_cell(target: Target, n: int, seconds: float, cell: Cell) -> None:
    sessions = await _open_sessions(target, n, cell)
    try:
        if not sessions:
            return
        before = _cpu_snapshot(target)
        started = time.perf_counter()
        deadline = started + seconds

        async def worker(session: Session, k: int) -> None:
            i = 0
            while time.perf_counter() < deadline:
                i += 1
                t0 = time.perf_counter()
                try:
                    async with asyncio.timeout(CALL_TIMEOUT):  # a timer, not a task per call as wait_for makes
                        await session.call(target.tool, {"text": f"s{k} c{i}"})
                except (CallError, OSError, TimeoutError) as exc:
                    cell.errors += 1
                    cell.first_error = cell.first_error or f"call: {exc!r:.300}"
                    continue
                cell.latencies.append((time.perf_counter() - t0) * 1000)
                cell.calls += 1

        calls_before = cell.calls
        await asyncio.gather(*(worker(s, k) for k, s in enumerate(sessions)))
        elapsed = time.perf_counter() - started
        cell.seconds += elapsed
        after = _cpu_snapshot(target)
        for role, ms in after.items():
            cell.cpu[role] = cell.cpu.get(role, 0.0) + ms - before[role]
        calls = cell.calls - calls_before
        if calls:
            cpu = {role: round((ms - before[role]) / calls, 3) for role, ms in after.items()}
            cell.rounds.append({"calls_per_s": round(calls / elapsed, 1), "cpu_ms_per_call": cpu})
    finally:
        await asyncio.gather(*(s.close() for s in sessions))


async def run_matrix(args: argparse.Namespace, targets: list[Target]) -> list[Cell]:
    cells = {(t.name, n): Cell(t.transport, t.path, n) for t in targets for n in args.levels}
    turn = 0
    for transport in args.transports:
        group = [t for t in targets if t.transport == transport]
        for n in args.levels:
            for _ in range(args.rounds):
                order = group[turn % len(group) :] + group[: turn % len(group)]
                turn += 1
                for target in order:
                    await run_cell(target, n, args.seconds, cells[(target.name, n)])
                    if args.verbose:
                        row = cells[(target.name, n)].row()
                        print(f"  {target.name} x{n}: {row['calls_per_s']} calls/s", file=sys.stderr, flush=True)
    return list(cells.values())


def _with_added_latency(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's `added_p50_ms`: its p50 minus the direct path's at the same transport and level."""
    direct = {(r["transport"], r["sessions"]): r["p50_ms"] for r in rows if r["path"] == "direct"}
    for row in rows:
        base = direct.get((row["transport"], row["sessions"]))
        known = base is not None and row["p50_ms"] is not None
        row["added_p50_ms"] = round(row["p50_ms"] - base, 3) if known and row["path"] != "direct" else None
    return rows


# --- soak ---------------------------------------------------------------------------------


async def run_soak(args: argparse.Namespace, target: Target) -> dict[str, Any]:
    """Calls at a steady rate through `target` for `args.soak` seconds; samples the gateway's RSS and fds."""
    gateway = target.roles["gateway"]
    cell = Cell(target.transport, target.path, args.sessions)
    sessions = await _open_sessions(target, args.sessions, cell)
    if not sessions:
        raise RuntimeError(f"no session opened: {cell.first_error}")
    interval: list[float] = []
    interval_errors = 0
    samples: list[dict[str, Any]] = []
    started = time.perf_counter()
    deadline = started + args.soak
    period = len(sessions) / args.rate

    async def worker(session: Session, k: int) -> None:
        nonlocal interval_errors
        next_at = started + k * period / len(sessions)
        i = 0
        while next_at < deadline and time.perf_counter() < deadline:
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            next_at += period  # a late call is sent at once: the rate catches up while it can
            i += 1
            if args.reopen_every and i % args.reopen_every == 0:
                await session.close()
                session = target.new_session()
                try:
                    await asyncio.wait_for(session.open(), CALL_TIMEOUT)
                except (CallError, OSError, TimeoutError) as exc:
                    cell.errors += 1
                    interval_errors += 1
                    cell.first_error = cell.first_error or f"reopen: {exc!r:.300}"
            t0 = time.perf_counter()
            try:
                async with asyncio.timeout(CALL_TIMEOUT):
                    await session.call(target.tool, {"text": f"s{k} c{i}"})
            except (CallError, OSError, TimeoutError) as exc:
                cell.errors += 1
                interval_errors += 1
                cell.first_error = cell.first_error or f"call: {exc!r:.300}"
                continue
            ms = (time.perf_counter() - t0) * 1000
            interval.append(ms)
            cell.latencies.append(ms)
            cell.calls += 1
        sessions[k] = session

    async def sampler() -> None:
        nonlocal interval, interval_errors
        while True:
            await asyncio.sleep(args.sample_every)
            lat, errors = sorted(interval), interval_errors
            interval, interval_errors = [], 0
            sample = {
                "t_s": round(time.perf_counter() - started, 1),
                "rss_mb": round(rss_mb(gateway), 1),
                "fds": open_fds(gateway),
                "calls": len(lat),
                "p50_ms": _ms(percentile(lat, 50)),
                "errors": errors,
            }
            samples.append(sample)
            if args.verbose:
                print(f"  soak {sample}", file=sys.stderr, flush=True)

    before = _cpu_snapshot(target)
    sampling = asyncio.create_task(sampler())
    try:
        await asyncio.gather(*(worker(s, k) for k, s in enumerate(sessions)))
    finally:
        sampling.cancel()
        await asyncio.gather(*(s.close() for s in sessions))
    cell.seconds = time.perf_counter() - started
    after = _cpu_snapshot(target)
    cell.cpu = {role: after[role] - before[role] for role in after}
    warm = [s for s in samples if s["t_s"] >= args.warmup] or samples[-1:]
    summary = {key: _drift([s[key] for s in warm]) for key in ("rss_mb", "fds", "p50_ms")}
    return {
        "row": cell.row(),
        "rate": args.rate,
        "warmup_s": args.warmup,
        "reopen_every": args.reopen_every,
        "summary": summary,
        "samples": samples,
    }


def _drift(values: list[float | None]) -> dict[str, float | None]:
    """The first sample after warm-up, the last, their drift in percent, and the maximum after warm-up."""
    known = [v for v in values if v is not None]  # an interval without calls has no p50
    if not known:
        return {"warm": None, "end": None, "drift_pct": None, "max": None}
    warm, end = known[0], known[-1]
    drift = round((end - warm) / warm * 100, 1) if warm else None
    return {"warm": warm, "end": end, "drift_pct": drift, "max": max(known)}


# --- report -------------------------------------------------------------------------------


ROLES = ("loadgen", "gateway", "proxy", "upstream")


def _num(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def print_table(rows: list[dict[str, Any]]) -> None:
    cpu_heads = "".join(f" {role:>8}" for role in (*ROLES, "all"))
    heads = f"{'calls/s':>8} {'p50 ms':>8} {'+direct':>8} {'p95 ms':>8} {'p99 ms':>8} {'errors':>6}"
    print(f"{'transport':9} {'path':13} {'N':>4} {heads} |{cpu_heads}")
    for row in rows:
        cpu = row["cpu_ms_per_call"]
        cells = "".join(" " + _num(cpu.get(r), 8, 3) for r in ROLES) + " " + _num(row["cpu_total_ms_per_call"], 8, 3)
        print(
            f"{row['transport']:9} {row['path']:13} {row['sessions']:>4} {row['calls_per_s']:>8.1f}"
            f" {_num(row['p50_ms'], 8, 2)} {_num(row['added_p50_ms'], 8, 2)} {_num(row['p95_ms'], 8, 2)}"
            f" {_num(row['p99_ms'], 8, 2)} {row['errors']:>6} |{cells}"
        )
    print("(+direct: p50 minus direct's p50 at the same N and transport, the latency a hop adds;")
    print(" CPU: milliseconds of CPU per call of each process, utime+stime from /proc/<pid>/stat; all: their sum)")
    for row in rows:
        if row["first_error"]:
            print(f"first error {row['transport']}/{row['path']} x{row['sessions']}: {row['first_error']}")


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Same-run ratios, the median over rounds (round i of a path against round i of the other):
    calls/s against direct's and FastMCP's, and the hop's CPU per call (the gateway's or the
    proxy's process) against the upstream's own CPU per call when called directly."""
    by = {(r["transport"], r["sessions"], r["path"]): r["rounds"] for r in rows}
    out = []
    for row in rows:
        if row["path"] == "direct":
            continue
        key = (row["transport"], row["sessions"])
        direct, peer = by.get((*key, "direct"), []), by.get((*key, "fastmcp"), [])
        mine = row["rounds"]
        hop = "gateway" if row["path"].startswith("gateway") else "proxy"
        entry: dict[str, Any] = {"transport": row["transport"], "sessions": row["sessions"], "path": row["path"]}
        entry["of_direct"] = _median_ratio(mine, direct, lambda r: r["calls_per_s"], lambda r: r["calls_per_s"])
        if row["path"] != "fastmcp":
            entry["of_fastmcp"] = _median_ratio(mine, peer, lambda r: r["calls_per_s"], lambda r: r["calls_per_s"])
        entry["cpu_of_upstream"] = _median_ratio(mine, direct, partial(_cpu_of, hop), partial(_cpu_of, "upstream"))
        out.append(entry)
    return out


def _cpu_of(role: str, round_: dict[str, Any]) -> float | None:
    value: float | None = round_["cpu_ms_per_call"].get(role)
    return value


def _median_ratio(mine: list[dict[str, Any]], theirs: list[dict[str, Any]], top: Any, bottom: Any) -> float | None:
    pairs = [(top(a), bottom(b)) for a, b in zip(mine, theirs, strict=False)]
    values = sorted(t / b for t, b in pairs if t is not None and b)
    if not values:
        return None
    middle = len(values) // 2
    median = values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2
    return round(median, 3)


def print_ratios(entries: list[dict[str, Any]]) -> None:
    print("same-run ratios, median over rounds (calls/s of direct, of FastMCP's; hop CPU/call of the upstream's own):")
    for e in entries:
        peer = f" {_num(e.get('of_fastmcp'), 6, 2)}x fastmcp" if "of_fastmcp" in e else ""
        print(
            f"  {e['transport']:5} {e['path']:13} N={e['sessions']:<4} {_num(e['of_direct'], 6, 2)}x direct{peer}"
            f"  cpu {_num(e['cpu_of_upstream'], 6, 2)}x upstream"
        )


def print_soak(result: dict[str, Any]) -> None:
    row = result["row"]
    print(
        f"soak through the gateway over {row['transport']}: {row['seconds']:.0f} s at {result['rate']} calls/s"
        f" asked, {row['calls_per_s']} done, {row['calls']} calls, {row['errors']} errors,"
        f" p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, gateway CPU {row['cpu_ms_per_call'].get('gateway')} ms/call"
    )
    print(f"samples every {result['sample_every_s']} s; reference after a warm-up of {result['warmup_s']} s")
    print(f"{'t s':>6} {'RSS MB':>8} {'fds':>5} {'calls':>6} {'p50 ms':>8} {'errors':>6}")
    for s in result["samples"]:
        print(
            f"{s['t_s']:>6} {s['rss_mb']:>8} {s['fds']:>5} {s['calls']:>6} {_num(s['p50_ms'], 8, 2)} {s['errors']:>6}"
        )
    for key, d in result["summary"].items():
        print(f"{key}: after warm-up {d['warm']}, end {d['end']}, drift {d['drift_pct']} %, max {d['max']}")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# --- main ---------------------------------------------------------------------------------


async def _run(args: argparse.Namespace, processes: Processes) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mcp-gateway-load-") as tmp:
        workdir = Path(tmp)
        options = (args.checkouts, args.catalog_tools, args.modern, args.upstream_sse)
        if args.soak:
            targets = await start_targets([args.soak_transport], [args.soak_path], workdir, processes, *options)
            result: dict[str, Any] = {"benchmark": "load-soak", "machine_start": machine()}
            result["sample_every_s"] = args.sample_every
            result |= await run_soak(args, targets[0])
        else:
            targets = await start_targets(args.transports, args.paths, workdir, processes, *options)
            result = {
                "benchmark": "load",
                "machine_start": machine(),
                "levels": args.levels,
                "seconds": args.seconds,
                "rounds": args.rounds,
            }
            result["rows"] = _with_added_latency([cell.row() for cell in await run_matrix(args, targets)])
            result["ratios"] = ratios(result["rows"])
        result["machine_end"] = machine()
        result["pids"] = processes.pids()
        return result


async def _bounded(args: argparse.Namespace) -> dict[str, Any]:
    processes = Processes()
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    try:
        async with asyncio.timeout(args.timeout):
            return await _run(args, processes)
    finally:
        await processes.stop()


def _levels(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", type=_levels, default=[1, 10, 50, 200], help="concurrent sessions (1,10,50,200)")
    parser.add_argument("--transports", type=_names, default=list(TRANSPORTS), help="http,stdio")
    parser.add_argument(
        "--paths", type=_names, help="of direct,gateway,fastmcp,fastmcp-fresh,gateway@NAME (direct,gateway,fastmcp)"
    )
    add_checkout_option(parser, "also path gateway@NAME: the gateway of another checkout (its .venv), in the same run")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per cell (3)")
    parser.add_argument("--rounds", type=int, default=1, help="turns per path and level, summed (1)")
    parser.add_argument(
        "--modern",
        action="store_true",
        help="HTTP sessions speak MCP 2026-07-28 (no handshake or session; the envelope in every request's _meta)",
    )
    parser.add_argument(
        "--upstream-sse",
        action="store_true",
        help="the HTTP paths' upstream speaks the legacy HTTP+SSE transport (`transport: sse`); no direct path",
    )
    parser.add_argument(
        "--catalog-tools",
        type=int,
        default=0,
        help="every gateway also serves this many more tools, from an in-memory plugin server (0)",
    )
    parser.add_argument("--soak", type=float, default=0.0, metavar="SECONDS", help="soak through the gateway instead")
    parser.add_argument("--soak-transport", choices=TRANSPORTS, default="http", help="transport of the soak (http)")
    parser.add_argument("--soak-path", default="gateway", help="soak: gateway or gateway@NAME (gateway)")
    parser.add_argument("--rate", type=float, default=200.0, help="soak: calls per second (200)")
    parser.add_argument("--sessions", type=int, default=10, help="soak: concurrent sessions sharing the rate (10)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="soak: seconds between samples (5)")
    parser.add_argument("--warmup", type=float, help="soak: seconds before the reference sample (a tenth, at most 60)")
    parser.add_argument(
        "--reopen-every", type=int, default=0, help="soak: a session is closed and reopened every N calls"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="bound on the whole run, seconds (900)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object, last on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="progress on stderr")
    args = parser.parse_args(argv)
    args.checkouts = {"": Checkout(REPO)} | dict(args.gateway_checkout)
    gateways = [f"gateway@{name}" for name in args.checkouts if name]
    if args.paths is None:
        args.paths = [*DEFAULT_PATHS[:2], *gateways, *DEFAULT_PATHS[2:]]
    for name in args.transports:
        if name not in TRANSPORTS:
            parser.error(f"--transports: {name!r} is not one of {', '.join(TRANSPORTS)}")
    for name in [*args.paths, args.soak_path]:
        if name not in (*PATHS, *gateways):
            parser.error(f"--paths: {name!r} is not one of {', '.join((*PATHS, *gateways))}")
    if not args.soak_path.startswith("gateway"):
        parser.error("--soak-path: a gateway")
    if args.upstream_sse and "direct" in args.paths and "http" in args.transports:
        parser.error("--upstream-sse: leave out the direct path (the load generator speaks streamable HTTP only)")
    if args.warmup is None:
        args.warmup = min(60.0, args.soak / 10)
    needs_fastmcp = not args.soak and any(p.startswith("fastmcp") for p in args.paths)
    if needs_fastmcp and importlib.util.find_spec("fastmcp") is None:
        parser.error("the fastmcp paths need FastMCP: `scripts/bootstrap test,bench` (or leave them out with --paths)")
    os.environ.update(QUIET_ENV)  # inherited by the processes it starts

    try:
        result = asyncio.run(_bounded(args))
    except TimeoutError:
        sys.exit(f"bench/load.py: the run passed --timeout {args.timeout} s; every process it started is stopped")
    except (asyncio.CancelledError, KeyboardInterrupt):
        sys.exit("bench/load.py: stopped; every process it started is stopped")
    if args.soak:
        print_soak(result)
    else:
        print(
            f"{', '.join(args.transports)}: {args.seconds} s per cell, {args.rounds} round(s);"
            f" start {result['machine_start']}, end loadavg {result['machine_end']['loadavg']}"
        )
        print_table(result["rows"])
        print_ratios(result["ratios"])
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
