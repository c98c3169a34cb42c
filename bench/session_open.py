"""What a handshake-era session costs the gateway to open and close, by `GATEWAY_HTTP__RESPONSE_MODE`.

    python bench/session_open.py                    # 1000 sessions a round, 3 measured rounds
    python bench/session_open.py --sessions 300 --rounds 5 --json

Two gateway children (`serve --transport http`, no servers, records off), one per mode (`auto`: the
`initialize` answer is a JSON body; `sse`: an SSE stream, the SDK's default). A raw HTTP/1.1 client
(httpx2, one kept-alive connection) opens a session (`initialize`, `notifications/initialized`) and
closes it (`DELETE`), `--sessions` times a round; the modes take turns, after one warm-up round
each. Printed per mode: the median over rounds of the gateway's CPU per session (utime+stime from
`/proc/<pid>/stat`) and of sessions/s, and the ratio auto/sse.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parent.parent
MODES = ("auto", "sse")
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
VERSION = "2025-06-18"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": VERSION, "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
READY = "mcp-gateway: serving on "


def start_gateway(folder: Path, mode: str) -> tuple[subprocess.Popen[str], str]:
    """A gateway child with no servers in `mode`; it and its URL, once it prints it (60 s at most)."""
    config = folder / "gateway.yaml"
    config.write_text("mcps: {}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env |= {
        "GATEWAY_DATA_DIR": str(folder / "data"),
        "GATEWAY_PLUGINS__ENTRY_POINTS": "false",
        "GATEWAY_EMBEDDING__ENABLED": "false",
        "GATEWAY_RECORDS__ENABLED": "false",
        "GATEWAY_LOG_LEVEL": "WARNING",
        "GATEWAY_HTTP__RESPONSE_MODE": mode,
        "PYTHONPATH": str(REPO),
    }
    argv = [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"]
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    assert process.stderr is not None
    end = time.monotonic() + 60
    while time.monotonic() < end and select.select([process.stderr], [], [], end - time.monotonic())[0]:
        line = process.stderr.readline()
        if not line:
            break
        if line.startswith(READY):  # then drained, so that a chatty gateway never blocks on the pipe
            threading.Thread(target=process.stderr.read, daemon=True).start()
            return process, line[len(READY) :].strip()
    process.kill()
    raise RuntimeError(f"the gateway ({mode}) did not print {READY!r} within 60 s")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def open_and_close(http: httpx2.Client, url: str, n: int) -> None:
    for _ in range(n):
        opened = http.post(url, headers=HEADERS, json=INITIALIZE)
        opened.raise_for_status()
        session = HEADERS | {"Mcp-Session-Id": opened.headers["mcp-session-id"], "MCP-Protocol-Version": VERSION}
        http.post(url, headers=session, json=INITIALIZED).raise_for_status()
        http.delete(url, headers=session).raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000, help="sessions opened and closed a round (1000)")
    parser.add_argument("--rounds", type=int, default=3, help="measured rounds per mode, after one warm-up (3)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object, last on stdout")
    args = parser.parse_args()
    if args.sessions < 1 or args.rounds < 1:
        parser.error("--sessions and --rounds must be at least 1")
    rows: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as scratch:
        gateways = {}
        try:
            for mode in MODES:
                (Path(scratch) / mode).mkdir()
                gateways[mode] = start_gateway(Path(scratch) / mode, mode)
            with httpx2.Client(timeout=30) as http:
                for round_ in range(args.rounds + 1):
                    for mode in MODES if round_ % 2 == 0 else MODES[::-1]:
                        process, url = gateways[mode]
                        cpu, wall = cpu_seconds(process.pid), time.perf_counter()
                        open_and_close(http, url, args.sessions)
                        if round_:  # the first is the warm-up
                            spent = (cpu_seconds(process.pid) - cpu) * 1000 / args.sessions
                            rows[mode].append((spent, args.sessions / (time.perf_counter() - wall)))
        finally:
            for process, _ in gateways.values():
                process.terminate()
                process.wait(timeout=10)
    summary = {
        mode: {
            "cpu_ms_per_session": round(statistics.median(r[0] for r in rows[mode]), 3),
            "sessions_per_s": round(statistics.median(r[1] for r in rows[mode]), 1),
        }
        for mode in MODES
    }
    print(f"{args.sessions} sessions a round, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}")
    for mode in MODES:
        print(
            f"{mode:5} gateway CPU {summary[mode]['cpu_ms_per_session']:.3f} ms/session, "
            f"{summary[mode]['sessions_per_s']:.0f} sessions/s"
        )
    sse_cpu = summary["sse"]["cpu_ms_per_session"]
    if sse_cpu > 0:
        print(f"auto/sse gateway CPU per session: {summary['auto']['cpu_ms_per_session'] / sse_cpu:.2f}")
    else:  # /proc counts CPU in clock ticks (10 ms): a short run can read none
        print("auto/sse gateway CPU per session: too few sessions to measure (raise --sessions)")
    if args.json:
        machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg": os.getloadavg()}
        print(json.dumps({"benchmark": "session_open", "machine": machine, "modes": summary, "rounds": rows}))


if __name__ == "__main__":
    main()
