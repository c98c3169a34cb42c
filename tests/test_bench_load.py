"""bench/load.py, run briefly: every path over both transports, the soak, and a run cut by its timeout.

Each run is a child process bounded by `--timeout` and by the subprocess timeout. Every process
it starts must be gone when it exits: the pids it reports, and any process that inherited the
marker this test puts in its environment.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LOAD = REPO / "bench" / "load.py"


def _run(*args: str, timeout: float = 55) -> tuple[subprocess.CompletedProcess[str], str]:
    marker = f"BENCH_LOAD_TEST={uuid.uuid4().hex}"
    name, _, value = marker.partition("=")
    done = subprocess.run(
        [sys.executable, str(LOAD), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=os.environ | {name: value},
        cwd=REPO,
    )
    return done, marker


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _with_marker(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker.encode() in environ.split(b"\0") and _alive(int(entry)):
                found.append(int(entry))
    return found


def _assert_all_stopped(marker: str, pids: tuple[int, ...] | list[int] = ()) -> None:
    deadline = time.monotonic() + 10  # a process killed a moment ago may still be exiting
    while True:
        left = [pid for pid in pids if _alive(pid)] + _with_marker(marker)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, f"processes left running: {left}"


def _last_json(stdout: str) -> dict[str, Any]:
    result = json.loads(stdout.strip().splitlines()[-1])
    assert isinstance(result, dict)
    return result


def test_a_short_run_reports_every_path_over_http_and_stdio_and_stops_its_processes() -> None:
    paths = "direct,gateway,fastmcp"  # FastMCP comes with the bench extra, which scripts/test installs
    # 12 cells, each starting its processes: 40 s at load 12, so the bound leaves room for a busy machine
    done, marker = _run(
        "--levels", "1,3", "--seconds", "0.4", "--paths", paths, "--json", "--timeout", "100", timeout=110
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = _last_json(done.stdout)
    rows = {(r["transport"], r["path"], r["sessions"]): r for r in result["rows"]}
    assert set(rows) == {(t, p, n) for t in ("http", "stdio") for p in paths.split(",") for n in (1, 3)}
    for key, row in rows.items():
        assert row["errors"] == 0, (key, row["first_error"])
        assert row["calls"] > 0 and row["calls_per_s"] > 0, key
        assert 0 < row["p50_ms"] <= row["p95_ms"] <= row["p99_ms"] < 10_000, key
        if row["path"] == "direct":
            assert row["added_p50_ms"] is None
        else:
            assert row["added_p50_ms"] == round(row["p50_ms"] - rows[(key[0], "direct", key[2])]["p50_ms"], 3)
        assert abs(row["calls_per_s"] - row["calls"] / row["seconds"]) < 0.01 * row["calls_per_s"] + 0.1, key
        roles = {"loadgen", "upstream"} | {"direct": set(), "gateway": {"gateway"}, "fastmcp": {"proxy"}}[row["path"]]
        assert set(row["cpu_ms_per_call"]) == roles, key
        assert all(ms is not None and ms >= 0 and math.isfinite(ms) for ms in row["cpu_ms_per_call"].values()), key
    for transport in ("http", "stdio"):  # the gateway works for every call: its CPU shows over a window
        assert sum(rows[(transport, "gateway", n)]["cpu_ms_per_call"]["gateway"] for n in (1, 3)) > 0
    assert "calls/s" in done.stdout and "p99 ms" in done.stdout
    ratios = {(e["transport"], e["path"], e["sessions"]): e for e in result["ratios"]}
    assert set(ratios) == {(t, p, n) for t in ("http", "stdio") for p in ("gateway", "fastmcp") for n in (1, 3)}
    for key, entry in ratios.items():  # one round: each ratio is that round's, from the rows' own figures
        row, direct = rows[key], rows[(key[0], "direct", key[2])]
        assert entry["of_direct"] == round(row["rounds"][0]["calls_per_s"] / direct["rounds"][0]["calls_per_s"], 3)
        upstream = direct["rounds"][0]["cpu_ms_per_call"]["upstream"]  # 0 only if /proc's 10 ms ticks missed it
        assert entry["cpu_of_upstream"] is None if not upstream else entry["cpu_of_upstream"] >= 0, key
        assert ("of_fastmcp" in entry) == (key[1] == "gateway"), key
    assert "same-run ratios" in done.stdout
    _assert_all_stopped(marker, result["pids"])


def test_modern_sessions_reach_a_gateway_with_a_larger_catalog() -> None:
    """`--modern` speaks 2026-07-28 (no handshake, the envelope in `_meta`); `--catalog-tools` gives
    the gateway an in-memory server of that many more tools; calls go through without errors."""
    args = ["--transports", "http", "--levels", "2", "--seconds", "0.4", "--paths", "direct,gateway"]
    done, marker = _run(*args, "--modern", "--catalog-tools", "40", "--json", "--timeout", "45")
    assert done.returncode == 0, done.stderr[-3000:]
    result = _last_json(done.stdout)
    assert [(r["path"], r["errors"]) for r in result["rows"]] == [("direct", 0), ("gateway", 0)]
    assert all(r["calls"] > 0 for r in result["rows"])
    _assert_all_stopped(marker, result["pids"])


def test_an_sse_upstream_is_reached_by_the_gateway_and_fastmcp_and_direct_is_refused() -> None:
    """`--upstream-sse`: the HTTP paths' upstream speaks HTTP+SSE; the load generator cannot, so
    `direct` is refused with the reason before anything starts."""
    args = ["--transports", "http", "--levels", "2", "--seconds", "0.4", "--upstream-sse"]
    done, marker = _run(*args, "--paths", "gateway,fastmcp", "--json", "--timeout", "45")
    assert done.returncode == 0, done.stderr[-3000:]
    result = _last_json(done.stdout)
    assert [(r["path"], r["errors"]) for r in result["rows"]] == [("gateway", 0), ("fastmcp", 0)]
    assert all(r["calls"] > 0 for r in result["rows"])
    _assert_all_stopped(marker, result["pids"])
    refused, _ = _run(*args, "--paths", "direct,gateway")
    assert refused.returncode == 2 and "leave out the direct path" in refused.stderr


def test_a_short_soak_samples_the_gateways_memory_and_file_descriptors() -> None:
    """Through the gateway of a checkout named on the command line (this one): `gateway@NAME`."""
    soak = ["--soak", "2", "--rate", "50", "--sessions", "2", "--sample-every", "0.5"]
    done, marker = _run(*soak, f"--gateway-checkout=here={REPO}", "--soak-path=gateway@here", "--json", "--timeout=45")
    assert done.returncode == 0, done.stderr[-3000:]
    result = _last_json(done.stdout)
    assert result["row"]["path"] == "gateway@here"
    assert result["row"]["errors"] == 0, result["row"]["first_error"]
    assert result["row"]["calls"] >= 20
    assert len(result["samples"]) >= 2
    assert all(s["rss_mb"] > 10 and s["fds"] > 3 for s in result["samples"])
    summary = result["summary"]
    assert set(summary) == {"rss_mb", "fds", "p50_ms"}
    assert summary["rss_mb"]["max"] >= summary["rss_mb"]["warm"] > 0
    assert "drift" in done.stdout
    _assert_all_stopped(marker, result["pids"])


def test_a_run_cut_by_its_timeout_stops_every_process_it_started() -> None:
    done, marker = _run("--transports", "http", "--paths", "direct,gateway", "--seconds", "30", "--timeout", "4")
    assert done.returncode != 0
    assert "--timeout" in done.stderr
    _assert_all_stopped(marker)
