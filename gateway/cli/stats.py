"""`mcp-gateway stats`: calls, error rates and latencies per server and tool, from the records (and CSV)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gateway.cli.common import EXIT_FAILED, EXIT_OK, Usage
from gateway.config.settings import Settings
from gateway.records.service import open_store
from gateway.records.store import RecordsError

__all__ = ["add_parsers", "run_stats"]


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    stats = commands.add_parser("stats", help="calls, error rates and latencies per server and tool, from the records")
    stats.add_argument("--since", help="a duration back from now (30m, 24h, 7d) or an ISO date/time (default: all)")
    stats.add_argument("--json", action="store_true", help="print JSON for scripts")
    stats.add_argument("--csv", type=Path, metavar="DIR", help="also write executions, failures and feedback as CSV")
    stats.set_defaults(run=run_stats)


def run_stats(args: argparse.Namespace, settings: Settings) -> int:
    return _stats(settings, args.since, args.json, args.csv)


def _stats(settings: Settings, since_text: str | None, as_json: bool, csv_dir: Path | None) -> int:
    """`stats`: read the records (SQLite in the data dir, or GATEWAY_DATABASE_URL)."""
    from gateway.records.stats import compute_stats, executions_for_stats, export_csv, format_stats, parse_since

    try:
        since = parse_since(since_text, time.time()) if since_text else None
    except ValueError as exc:
        raise Usage(str(exc)) from None
    store = open_store(settings)
    try:
        servers = compute_stats(executions_for_stats(store, since))
        exported = export_csv(store, csv_dir, since) if csv_dir is not None else []
    except RecordsError as exc:
        print(f"mcp-gateway: cannot read the records: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        store.close()
    if as_json:
        body = {"store": store.description, "since": since, "servers": [s.to_json() for s in servers]}
        body["csv"] = [{"path": str(path), "rows": rows} for path, rows in exported]
        print(json.dumps(body, indent=2))
    else:
        print(format_stats(servers))
        for path, rows in exported:
            print(f"wrote {path} ({rows} rows)", file=sys.stderr)
    return EXIT_OK
