"""Idle memory of a gateway started as the quick start does: RSS, PSS and USS at fixed times after it answers.

    python bench/idle_memory.py                           # router on, then embeddings off; ready, +10, +30, +60 s
    python bench/idle_memory.py --at 0,20 --modes router --json
    python bench/idle_memory.py --gateway-checkout base=/tmp/mem-base   # this checkout and base, in turns

Each run starts `python -m gateway --config external-mcps.yaml serve --transport http --port 0`
(the repository's example config, as `scripts/serve` serves it, bound to 127.0.0.1 on a free
port) with a fresh data dir, so its first start embeds the catalog as a new user's does;
`--warm` then starts it again on the same data dir (the embedding cache filled: every later
start). The clock starts when the gateway answers `initialize` ("ready"); nothing else is
asked of it. At each time of `--at` it reads `/proc/<pid>/smaps_rollup` (Rss, Pss, and
Private_Clean + Private_Dirty: USS) and `/proc/<pid>/status` (RssAnon, RssFile) of the gateway
and, summed, of any child processes it started.

Modes: `router` (the defaults: the bundled embedding model and BM25) and `bm25`
(`GATEWAY_EMBEDDING__ENABLED=false`, the baseline: what the model adds is the difference).
`--gateway-checkout NAME=DIR` adds the gateway of another checkout (its `.venv` if it has one,
its own `external-mcps.yaml`), e.g. `git archive main | tar -x -C /tmp/mem-base` to measure a
change against main. The runs go one at a time, in turns, so that no run's start-up competes
with another's. `--timeout` bounds the whole run; every process it starts is stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.load import machine  # noqa: E402
from bench.load_targets import Checkout, Processes, _spawn_http, add_checkout_option, children  # noqa: E402
from bench.mcp_wire import HttpSession  # noqa: E402

READY = "mcp-gateway: serving on "
MODES: dict[str, dict[str, str]] = {"router": {}, "bm25": {"GATEWAY_EMBEDDING__ENABLED": "false"}}
FIGURES = ("rss", "pss", "uss", "anon", "file")


# --- /proc ------------------------------------------------------------------------------


def memory_mb(pid: int) -> dict[str, float]:
    """Rss, Pss, USS (private pages), RssAnon and RssFile of one process, in MB."""
    kb: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        kb[name] = int(rest.split()[0])
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("RssAnon", "RssFile"):
            kb[name] = int(rest.split()[0])
    return {
        "rss": kb["Rss"] / 1024,
        "pss": kb["Pss"] / 1024,
        "uss": (kb["Private_Clean"] + kb["Private_Dirty"]) / 1024,
        "anon": kb["RssAnon"] / 1024,
        "file": kb["RssFile"] / 1024,
    }


def sample(pid: int) -> dict[str, float]:
    """The gateway's figures, and `children_rss`: the RSS of its child processes, summed."""
    figures = memory_mb(pid)
    kids = 0.0
    for kid in children(pid):
        try:
            kids += memory_mb(kid)["rss"]
        except (OSError, KeyError):  # gone meanwhile
            continue
    return figures | {"children_rss": kids}


# --- one run ------------------------------------------------------------------------------


def _env(data_dir: Path, mode: str, checkout: Checkout) -> dict[str, str]:
    """The user's environment without GATEWAY_* settings, a fresh data dir, and the mode's settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    return checkout.env(env | {"GATEWAY_DATA_DIR": str(data_dir)} | MODES[mode])


async def one_run(checkout: Checkout, mode: str, data_dir: Path, at: list[float]) -> dict[str, Any]:
    """Start the gateway, wait for its answer to `initialize`, sample at each time of `at`, stop it."""
    processes = Processes()
    try:
        started = time.monotonic()
        argv = [*checkout.command(checkout.root / "external-mcps.yaml", "http"), "--port", "0"]
        pid, url = await _spawn_http(processes, argv, _env(data_dir, mode, checkout), READY, checkout.root)
        session = HttpSession(url)
        await session.open()
        await session.close()
        ready = time.monotonic()
        samples = []
        for offset in at:
            await asyncio.sleep(max(0.0, ready + offset - time.monotonic()))
            samples.append({"at_s": offset} | {k: round(v, 1) for k, v in sample(pid).items()})
        return {"ready_s": round(ready - started, 2), "samples": samples}
    finally:
        await processes.stop()


async def run_all(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"benchmark": "idle-memory", "machine_start": machine(), "at_s": args.at, "runs": []}
    with tempfile.TemporaryDirectory(prefix="mcp-gateway-idle-") as tmp:
        starts = ("cold", "warm") if args.warm else ("cold",)
        for round_ in range(args.rounds):
            for name, checkout in args.checkouts.items():
                for mode in args.modes:
                    data_dir = Path(tmp) / f"{round_}-{name or 'this'}-{mode}"
                    for start in starts:
                        run = await one_run(checkout, mode, data_dir, args.at)
                        row = {"gateway": name or "this", "mode": mode, "start": start, "round": round_} | run
                        result["runs"].append(row)
                        if args.verbose:
                            print(json.dumps(row), file=sys.stderr, flush=True)
    result["machine_end"] = machine()
    result["medians"] = medians(result["runs"])
    return result


def medians(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median of each figure at each time, over the rounds of each gateway, mode and start."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault((run["gateway"], run["mode"], run["start"]), []).append(run)
    rows = []
    for (gateway, mode, start), group in groups.items():
        for i, first in enumerate(group[0]["samples"]):
            row: dict[str, Any] = {"gateway": gateway, "mode": mode, "start": start, "at_s": first["at_s"]}
            for key in (*FIGURES, "children_rss"):
                row[key] = round(statistics.median(run["samples"][i][key] for run in group), 1)
            row["ready_s"] = round(statistics.median(run["ready_s"] for run in group), 2)
            rows.append(row)
    return rows


def print_table(result: dict[str, Any]) -> None:
    start, end = result["machine_start"], result["machine_end"]
    print(f"python {start['python']}, {start['cpus']} CPUs, load average {start['loadavg']} -> {end['loadavg']}")
    heads = f"{'RSS':>7} {'PSS':>7} {'USS':>7} {'anon':>7} {'file':>6}"
    print(f"{'gateway':<10} {'mode':<7} {'start':<5} {'at':>5} {heads}")
    for row in result["medians"]:
        figures = " ".join(f"{row[key]:>7.1f}" for key in FIGURES[:4])
        print(
            f"{row['gateway']:<10} {row['mode']:<7} {row['start']:<5} {row['at_s']:>4g}s {figures} {row['file']:>6.1f}"
            + (f"  (+{row['children_rss']:.1f} MB in children)" if row["children_rss"] else "")
        )
    print("MB; at: seconds after the gateway answered initialize (ready)")


def _times(text: str) -> list[float]:
    times = sorted(float(x) for x in text.split(",") if x.strip())
    if not times or times[0] < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: seconds after ready, comma-separated, e.g. 0,10,30,60")
    return times


def _modes(text: str) -> list[str]:
    modes = [x.strip() for x in text.split(",") if x.strip()]
    if not modes or any(mode not in MODES for mode in modes):
        raise argparse.ArgumentTypeError(f"{text!r}: of {','.join(MODES)}")
    return modes


async def _bounded(args: argparse.Namespace) -> dict[str, Any]:
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    async with asyncio.timeout(args.timeout):
        return await run_all(args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--at", type=_times, default=[0.0, 10.0, 30.0, 60.0], help="seconds after ready (0,10,30,60)")
    parser.add_argument("--modes", type=_modes, default=list(MODES), help="of router,bm25 (both)")
    parser.add_argument("--warm", action="store_true", help="also start each again on its data dir (cache filled)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each, medians reported (1)")
    add_checkout_option(parser, "also the gateway of another checkout (its .venv and external-mcps.yaml), in turns")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run, seconds (600)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object, last on stdout")
    parser.add_argument("-v", "--verbose", action="store_true", help="each run on stderr as it ends")
    args = parser.parse_args(argv)
    args.checkouts = {"": Checkout(REPO)} | dict(args.gateway_checkout)
    try:
        result = asyncio.run(_bounded(args))
    except (TimeoutError, asyncio.CancelledError, KeyboardInterrupt) as e:
        why = f"passed --timeout {args.timeout} s" if isinstance(e, TimeoutError) else "was stopped"
        sys.exit(f"bench/idle_memory.py: the run {why}; every process it started is stopped")
    print_table(result)
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
