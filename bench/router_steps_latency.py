"""Search latency of ranking long requests step by step (`RouterConfig.split`), on and off.

    python bench/router_steps_latency.py --set ../shared/eval/livemcpbench --long ../shared/eval/metatool
    python bench/router_steps_latency.py ... --rounds 3 --json

For each set (and the long requests built from `--long`'s single-tool ones, as
`mcp-gateway eval --long` builds them), two routers over the same index (vectors shared
through an in-memory cache, full texts enriched): the default, and the default with
`split="off"`. Each request is searched by both in turn, alternating which goes first, so
that the shared machine's load falls on both alike; the timer is around `Router.search`,
query embeddings included. Prints p50/p95 per set and router, and how many requests were
split (three sentences or more).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.config.settings import Settings  # noqa: E402
from gateway.router.eval_sets import EvalSet, load_set  # noqa: E402
from gateway.router.index import Router  # noqa: E402
from gateway.router.long_requests import long_requests  # noqa: E402
from gateway.router.model_loading import load_embedder  # noqa: E402
from gateway.router.router_config import RouterConfig  # noqa: E402
from gateway.router.steps import split_query  # noqa: E402


class _Memory:
    """An embedding cache in memory: both routers embed each document once."""

    def __init__(self) -> None:
        self.vectors: dict[str, Any] = {}

    def get_many(self, keys: Any) -> dict[str, Any]:
        return {k: self.vectors[k] for k in keys if k in self.vectors}

    def put_many(self, items: Any) -> None:
        self.vectors.update(items)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", type=Path, action="append", default=[], dest="sets")
    parser.add_argument("--long", type=Path, action="append", default=[])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    settings = Settings()
    embedder = load_embedder(settings.embedding, settings.data_dir)
    assert embedder is not None
    sets = [load_set(d / "catalog.json", d / "queries.jsonl") for d in args.sets]
    for d in args.long:
        source = load_set(d / "catalog.json", d / "queries.jsonl")
        sets.append(EvalSet(f"{source.name}-long", source.records, long_requests(source.queries, seed=0)))
    cache = _Memory()
    default = RouterConfig()
    configs = {"steps on (default)": default, "steps off": replace(default, split="off")}
    out: dict[str, Any] = {}
    for s in sets:
        routers = {}
        for name, config in configs.items():
            router = Router(embedder, cache=cache, config=config)
            router.update(s.records)
            router.enrich()
            routers[name] = router
        times: dict[str, list[float]] = {name: [] for name in configs}
        names = list(configs)
        for r in routers.values():
            r.search(s.queries[0].query, k=10)  # warm-up
        for round_ in range(args.rounds):
            for i, q in enumerate(s.queries):
                order = names if (i + round_) % 2 == 0 else names[::-1]
                for name in order:
                    started = time.perf_counter()
                    routers[name].search(q.query, k=10)
                    times[name].append((time.perf_counter() - started) * 1000)
        split = sum(1 for q in s.queries if len(split_query(q.query, clauses=False)) >= default.split_min_steps)
        out[s.name] = {
            "tools": len(s.records),
            "requests": len(s.queries),
            "split_requests": split,
            **{
                name: {
                    "p50_ms": round(statistics.median(t), 2),
                    "p95_ms": round(_percentile(t, 95), 2),
                }
                for name, t in times.items()
            },
        }
        print(f"{s.name}: {len(s.records)} tools, {len(s.queries)} requests, {split} ranked step by step")
        for name, t in times.items():
            print(f"  {name:<20} p50 {statistics.median(t):7.2f} ms   p95 {_percentile(t, 95):7.2f} ms")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
