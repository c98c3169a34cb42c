"""How long `scripts/serve` takes, warm, from the command to the first answered MCP request.

    python bench/serve_start.py                 # 5 starts of each command, taking turns
    python bench/serve_start.py --starts 3 --json

Two commands take turns, each started `--starts` times with the repository's example config
(`external-mcps.yaml`) in a fresh temporary data dir: `scripts/serve --port 0` (which runs
`scripts/bootstrap` first: with .venv up to date it installs nothing) and `.venv/bin/mcp-gateway
serve --transport http --port 0` (the gateway alone, the floor). For each start it times, from
the moment the process is spawned: the start-up line on stderr, the answer to `initialize`, and
the answer to the first `tools/list` (which waits, bounded, for the servers still connecting), and
the CPU the process (and `scripts/bootstrap`) had used by then, which a loaded machine inflates
less than the wall time. Printed: the median of each, the worst wall time to the first
`tools/list`, per command, and the ratio of the medians. A start
that prints pip's or setuptools' output (an install) is reported as such. `--timeout` bounds the
whole run; every process started is stopped (SIGINT, as Ctrl-C, then SIGKILL).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parent.parent
READY = "mcp-gateway: serving on "
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}},
}
COMMANDS = {
    "scripts/serve": ["scripts/serve", "--port", "0"],
    "mcp-gateway serve": [".venv/bin/mcp-gateway", "serve", "--transport", "http", "--port", "0"],
}
INSTALL_SIGNS = ("Editable installation", "Successfully installed", "pip install")


def _answer(response: httpx2.Response) -> dict[str, object]:
    """The JSON-RPC answer of a POST, from a JSON body or the SSE stream's `data:` lines."""
    if response.headers.get("content-type", "").startswith("application/json"):
        answer: dict[str, object] = response.json()
        return answer
    for line in response.text.splitlines():
        if line.startswith("data:"):
            message: dict[str, object] = json.loads(line[5:])
            if "id" in message:
                return message
    raise RuntimeError(f"no answer in {response.text[:200]!r}")


def cpu_seconds(pid: int) -> float:
    """CPU of the process so far, with its waited-for children (`scripts/serve`'s bootstrap: it execs the gateway)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def one_start(name: str, data_dir: Path, deadline: float) -> dict[str, object]:
    """Start one command, time its start-up line and its first two answers, stop it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env |= {"GATEWAY_DATA_DIR": str(data_dir), "GATEWAY_CONFIG": str(REPO / "external-mcps.yaml")}
    started = time.perf_counter()
    argv = list(COMMANDS[name])
    if name != "scripts/serve":
        argv[1:1] = ["--config", str(REPO / "external-mcps.yaml")]
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    output: list[str] = []
    url = ""
    try:
        assert process.stderr is not None
        timer = threading.Timer(max(1.0, deadline - time.monotonic()), process.kill)
        timer.start()
        try:
            for line in process.stderr:
                output.append(line)
                if line.startswith(READY):
                    url = line[len(READY) :].strip()
                    break
        finally:
            timer.cancel()
        if not url:
            raise RuntimeError(f"{name} printed no start-up line:\n{''.join(output)[-2000:]}")
        ready_line = time.perf_counter() - started
        threading.Thread(target=lambda: output.extend(process.stderr or []), daemon=True).start()
        with httpx2.Client(timeout=max(1.0, deadline - time.monotonic())) as client:
            first = client.post(url, json=INITIALIZE, headers=HEADERS)
            first.raise_for_status()
            _answer(first)
            initialized = time.perf_counter() - started
            session = {"Mcp-Session-Id": first.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
            notified = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            client.post(url, json=notified, headers=HEADERS | session).raise_for_status()
            request = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
            listed = client.post(url, json=request, headers=HEADERS | session)
            tools = _answer(listed)["result"]["tools"]  # type: ignore[index]
            listing = time.perf_counter() - started
            cpu = cpu_seconds(process.pid)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C in the terminal
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    installed = any(sign in line for line in output for sign in INSTALL_SIGNS)
    return {
        "start_up_line_s": ready_line,
        "initialize_s": initialized,
        "tools_list_s": listing,
        "cpu_s": cpu,
        "tools": len(tools),  # type: ignore[arg-type]
        "installed": installed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=5, help="starts of each command (default 5)")
    parser.add_argument("--timeout", type=float, default=300, help="bound on the whole run, in seconds")
    parser.add_argument("--json", action="store_true", help="also print one JSON object last")
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    runs: dict[str, list[dict[str, object]]] = {name: [] for name in COMMANDS}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="serve-start-") as tmp:
        for round_ in range(args.starts):
            order = list(COMMANDS) if round_ % 2 == 0 else list(reversed(COMMANDS))
            for name in order:
                runs[name].append(one_start(name, Path(tmp) / f"{len(runs[name])}-{name[:7]}", deadline))
    figures: dict[str, dict[str, float | int]] = {}
    print(f"python {platform.python_version()}, load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    heads = f"{'start-up line':>14} {'initialize':>11} {'tools/list':>11} {'worst list':>11} {'CPU':>7}"
    print(f"{'command':<20} {heads} installs")
    for name, starts in runs.items():
        row: dict[str, float | int] = {
            key: statistics.median(float(s[key]) for s in starts)  # type: ignore[arg-type]
            for key in ("start_up_line_s", "initialize_s", "tools_list_s", "cpu_s")
        }
        row["tools_list_worst_s"] = max(float(s["tools_list_s"]) for s in starts)  # type: ignore[arg-type]
        row["installs"] = sum(1 for s in starts if s["installed"])
        row["tools"] = int(starts[0]["tools"])  # type: ignore[call-overload]
        figures[name] = row
        print(
            f"{name:<20} {row['start_up_line_s']:>13.2f}s {row['initialize_s']:>10.2f}s "
            f"{row['tools_list_s']:>10.2f}s {row['tools_list_worst_s']:>10.2f}s {row['cpu_s']:>6.2f}s "
            f"{row['installs']:>8}"
        )
    ratio = figures["scripts/serve"]["tools_list_s"] / figures["mcp-gateway serve"]["tools_list_s"]
    print(f"scripts/serve / mcp-gateway serve, median to the first tools/list: {ratio:.2f}")
    cpu_ratio = figures["scripts/serve"]["cpu_s"] / figures["mcp-gateway serve"]["cpu_s"]
    print(f"scripts/serve / mcp-gateway serve, median CPU by then: {cpu_ratio:.2f}")
    if args.json:
        print(json.dumps({"starts": args.starts, "figures": figures, "ratio": ratio, "runs": runs}))


if __name__ == "__main__":
    main()
