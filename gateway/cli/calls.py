"""`mcp-gateway calls`: the call log, read from the records store directly (no running gateway needed).

Shows the latest calls, oldest first like a log, with the filters of the console's `GET calls`
(`gateway.records.queries`); `--follow` then polls the store for new ones until Ctrl-C.
`--json` prints one JSON object per call and line (JSON Lines), for scripts and `jq`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

from gateway.cli.check_report import print_table
from gateway.cli.common import EXIT_FAILED, EXIT_OK, Usage
from gateway.config.settings import Settings
from gateway.records.queries import CALL_STATUSES, MAX_CALLS, CallFilter, call_rows
from gateway.records.service import open_store
from gateway.records.stats import parse_since
from gateway.records.store import RecordsError, RecordStore

__all__ = ["FOLLOW_SECONDS", "add_parsers", "run_calls"]

FOLLOW_SECONDS = 1.0
"""How often `--follow` reads the store for new calls."""
_HEADERS = ["TIME", "SERVER", "TOOL", "STATUS", "MS", "ID", "SUMMARY"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    calls = commands.add_parser("calls", help="the call log from the records: latest calls, with filters; --follow")
    calls.add_argument("--follow", "-f", action="store_true", help="keep printing new calls as they are recorded")
    calls.add_argument("--server", help="only calls to this server")
    calls.add_argument("--tool", help="only calls of this exposed tool name (prefix__tool)")
    calls.add_argument("--status", choices=CALL_STATUSES, help="only ok, error, timeout or refused calls")
    calls.add_argument("--since", help="a duration back from now (10m, 24h, 7d) or an ISO date/time")
    calls.add_argument(
        "--limit", type=int, default=20, help=f"how many of the latest calls (1-{MAX_CALLS}; default 20)"
    )
    calls.add_argument("--json", action="store_true", help="one JSON object per call and line")
    calls.set_defaults(run=run_calls)


def run_calls(args: argparse.Namespace, settings: Settings) -> int:
    try:
        since = parse_since(args.since, time.time()) if args.since else None
        flt = CallFilter(server=args.server, tool=args.tool, status=args.status, since=since, limit=args.limit)
    except ValueError as exc:
        raise Usage(str(exc)) from None
    store = open_store(settings)
    try:
        return _show(store, flt, follow=args.follow, as_json=args.json)
    except RecordsError as exc:
        print(f"mcp-gateway: cannot read the records: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()


def _show(store: RecordStore, flt: CallFilter, *, follow: bool, as_json: bool) -> int:
    rows = list(reversed(call_rows(store, flt)))
    _print(rows, as_json, header=True)
    if not follow:
        return EXIT_OK
    seen = {row["id"] for row in rows}
    last = max((row["at"] for row in rows), default=flt.since if flt.since is not None else time.time() - 1)
    while True:
        time.sleep(FOLLOW_SECONDS)
        newer = CallFilter(
            server=flt.server, tool=flt.tool, status=flt.status, since=last, limit=MAX_CALLS
        )  # from the last time seen: calls recorded late with an earlier time are caught by `seen`
        fresh = [row for row in reversed(call_rows(store, newer)) if row["id"] not in seen]
        if fresh:
            _print(fresh, as_json, header=False)
            seen.update(row["id"] for row in fresh)
            last = max(row["at"] for row in fresh)
            if len(seen) > 10 * MAX_CALLS:
                seen = {row["id"] for row in fresh}


def _print(rows: list[dict[str, Any]], as_json: bool, *, header: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False), flush=True)
        return
    if not rows and header:
        print("No calls recorded match.", file=sys.stderr)
        return
    table = [
        [
            datetime.fromtimestamp(row["at"], UTC).strftime("%Y-%m-%d %H:%M:%S"),
            row["server"] or "(no server)",
            row["tool"],
            row["status"] if not row["error_code"] else f"{row['status']} ({row['error_code']})",
            f"{row['latency_ms']:.0f}",
            row["id"],
            " ".join((row["summary"] or "").split())[:50],
        ]
        for row in rows
    ]
    if header:
        print_table(table, _HEADERS)
    else:  # followed calls: one line each as they come (the columns of the first table are not known here)
        for line in table:
            print("  ".join(line).rstrip())
    sys.stdout.flush()
