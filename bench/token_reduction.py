"""How much smaller `tools/list` gets in the `search` and `dynamic` modes than in `all` mode.

For a static catalog (LiveMCPBench format) it measures the JSON size of the
`tools/list` result a client receives in each mode, and estimates tokens as
bytes / 4 (a common rule of thumb for English JSON; real tokenizers differ by
maybe 20 %, equally for every mode, so the ratios hold).

- all: every tool, as the gateway lists it;
- search: the two gateway tools (`search_tools`, `call_tool`), no pinned tools;
- dynamic: the two gateway tools plus the tools one search added (k per query,
  the router's real results for each query of the queries file), median over queries.

Run from the repository root:

    python bench/token_reduction.py --catalog ../shared/eval/livemcpbench/catalog.json \
        --queries ../shared/eval/livemcpbench/queries.jsonl [--k 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
from pathlib import Path

import mcp_types as types

from gateway.router.eval import load_catalog, load_queries
from gateway.router.index import Router
from gateway.serving.exposure import CALL_TOOL, SEARCH_TOOL


def list_bytes(tools: list[types.Tool]) -> int:
    """Bytes of the JSON `tools/list` result carrying these tools."""
    result = types.ListToolsResult(tools=tools)
    return len(json.dumps(result.model_dump(by_alias=True, mode="json", exclude_none=True)).encode())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", type=Path, required=True)
    parser.add_argument("--queries", type=Path, required=True)
    parser.add_argument("--k", type=int, default=8, help="tools one search adds in dynamic mode (default 8)")
    parser.add_argument("--bm25", action="store_true", help="rank with BM25 alone (no embedding model)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last on stdout")
    args = parser.parse_args()

    records = load_catalog(args.catalog)
    queries = load_queries(args.queries)
    embedder = None
    if not args.bm25:
        from gateway.config.settings import Settings
        from gateway.router.model_loading import load_embedder

        settings = Settings()
        embedder = load_embedder(settings.embedding, settings.data_dir)
    router = Router(embedder)
    router.update(records)
    by_name = {r.name: r.tool for r in records}

    all_bytes = list_bytes([r.tool for r in records])
    search_bytes = list_bytes([SEARCH_TOOL, CALL_TOOL])
    dynamic_sizes = [
        list_bytes([SEARCH_TOOL, CALL_TOOL] + [by_name[h.name] for h in router.search(q.query, k=args.k)])
        for q in queries
    ]
    dynamic_bytes = int(statistics.median(dynamic_sizes))
    rows = [
        ("all", len(records), all_bytes),
        ("search", 2, search_bytes),
        (f"dynamic (k={args.k})", 2 + args.k, dynamic_bytes),
    ]
    print(f"catalog: {args.catalog} ({len(records)} tools); tokens estimated as bytes/4")
    print(f"{'mode':<16}{'tools':>7}{'bytes':>10}{'~tokens':>10}{'vs all':>9}")
    for mode, count, size in rows:
        print(f"{mode:<16}{count:>7}{size:>10}{size // 4:>10}{size / all_bytes:>9.1%}")
    if args.json:
        print(
            json.dumps(
                {
                    "tools": len(records),
                    "all_bytes": all_bytes,
                    "search_bytes": search_bytes,
                    "dynamic_bytes_median": dynamic_bytes,
                    "k": args.k,
                    "search_ratio": search_bytes / all_bytes,
                    "dynamic_ratio": dynamic_bytes / all_bytes,
                }
            )
        )
    return 0


if __name__ == "__main__":
    signal.alarm(600)  # bound the run: SIGALRM ends it after ten minutes
    sys.exit(main())
