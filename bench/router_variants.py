"""Recall of the router's ranking variants on a tool catalog and its queries.

Runs `gateway.router.eval.run_eval` once per variant with the bundled embedding model
(the product's default), and prints recall@1/5/10 and MRR per variant:

    python bench/router_variants.py --catalog CATALOG.json --queries QUERIES.jsonl
    python bench/router_variants.py ... --variants default,rrf-60   # a subset
    python bench/router_variants.py ... --lexical-gap               # the stress test below
    python bench/router_variants.py ... --long                      # long requests, below
    python bench/router_variants.py ... --json                      # one JSON object last
    python bench/router_variants.py --bm25-libraries                # BM25: ours vs bm25s

Each row also gives recall@5 and recall@10 on the two halves of the queries (the
queries at even and at odd lines of the file), a check that a change helps on both
halves rather than on a few queries: a variant chosen on one half is reported on the
other too.

`--lexical-gap` removes from every query the words that also occur in the names of the
tools it expects (compared as BM25 terms: lowercased, stemmed), so that the request's
wording no longer matches the tools' names: a rough stand-in for paraphrased requests,
where lexical matching is weak.

`--long` replaces the queries by long requests built from their single-tool ones, as
`mcp-gateway eval --long` builds them (`gateway.router.long_requests`, seed 0). With
`--shared-vectors`, the variants share one in-memory embedding cache (each document is
embedded once: much faster; `index s` is then not a cold build).

`--bm25-libraries` compares `gateway.router.bm25` with the `bm25s` package (which must be
installed; it is not a dependency): recall of BM25 alone on the queries, with bm25s's own
tokenizer and with ours, and the time to index the catalog and a synthetic 10,000-tool
catalog (bench/router_latency.py's) and to answer a query.

Variants (`RouterConfig` fields in brackets):

    bm25                 BM25 alone (the embedder is not loaded)           [fusion="bm25"]
    dense                cosine alone                                      [fusion="dense"]
    rrf-60, rrf-10       reciprocal rank fusion                            [fusion="rrf", rrf_k]
    weighted-0.5/0.6/0.7 weighted sum of cosine and BM25 coverage          [dense_weight]
    server-0.5/1.0       + the tool's server's score (MCP-Zero style)      [server_weight]
    split-mean/...       + sub-queries per step, merged                    [split, merge]
    steps-off            default, a long request ranked whole              [split="off"]
    steps-share          default, steps merged by share of the top k       [merge="share"]
    steps-2, steps-share-2  ... from two steps on, not three               [split_min_steps=2]
    raw-query            default, but the request embedded as written      [query_text="raw"]
    short-text           the short text's vector alone (the previous default) [full_document_weight=0]
    full-uncut           the full text cut at 512 word pieces, not 128     [full_document_tokens]
    default              RouterConfig(): short and full text's vectors blended
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.router.bm25 import tokenize  # noqa: E402
from gateway.router.documents import split_identifier  # noqa: E402
from gateway.router.eval import run_eval  # noqa: E402
from gateway.router.router_config import RouterConfig  # noqa: E402

VARIANTS: dict[str, RouterConfig] = {
    "bm25": RouterConfig(fusion="bm25"),
    "dense": RouterConfig(fusion="dense"),
    "rrf-60": RouterConfig(fusion="rrf", rrf_k=60),
    "rrf-10": RouterConfig(fusion="rrf", rrf_k=10),
    "weighted-0.5": RouterConfig(fusion="weighted", dense_weight=0.5),
    "weighted-0.6": RouterConfig(fusion="weighted", dense_weight=0.6),
    "weighted-0.7": RouterConfig(fusion="weighted", dense_weight=0.7),
    "server-0.5": RouterConfig(server_weight=0.5),
    "server-1.0": RouterConfig(server_weight=1.0),
    "rrf-server-0.5": RouterConfig(fusion="rrf", server_weight=0.5),
    "split-mean": RouterConfig(split="sentences", merge="mean"),
    "split-max": RouterConfig(split="sentences", merge="max"),
    "split-round-robin": RouterConfig(split="sentences", merge="round_robin"),
    "clauses-mean": RouterConfig(split="clauses", merge="mean"),
    "raw-query": RouterConfig(query_text="raw"),
    "short-text": RouterConfig(full_document_weight=0.0),
    "short-text-raw-query": RouterConfig(full_document_weight=0.0, query_text="raw"),
    "full-uncut": RouterConfig(full_document_tokens=512),
    "steps-off": RouterConfig(split="off"),
    "steps-share": RouterConfig(merge="share"),
    "steps-2": RouterConfig(split_min_steps=2),
    "steps-share-2": RouterConfig(merge="share", split_min_steps=2),
    "default": RouterConfig(),
}


def lexical_gap_queries(source: Path, destination: Path) -> None:
    """Write `source`'s queries without the words that occur in their expected tools' names."""
    with source.open(encoding="utf-8") as lines, destination.open("w", encoding="utf-8") as out:
        for line in lines:
            if not line.strip():
                continue
            item = json.loads(line)
            name_terms = {
                term
                for alternatives in item.get("expected") or ()
                for alternative in alternatives
                for word in split_identifier(str(alternative["tool"]))
                for term in tokenize(word)
            }
            words = str(item["query"]).split()
            kept = [w for w in words if not set(tokenize(w)) & name_terms]
            item["query"] = " ".join(kept) or item["query"]
            out.write(json.dumps(item, ensure_ascii=False) + "\n")


def halves(report: Any) -> dict[str, float]:
    """recall@5 and recall@10 over the scored queries at even and at odd positions."""
    out = {}
    scored = [entry for entry in report.per_query if "rr" in entry]
    for label, part in (("even", scored[0::2]), ("odd", scored[1::2])):
        for k in (5, 10):
            values = [entry.get(f"recall@{k}") for entry in part]
            if part and all(v is not None for v in values):
                out[f"recall@{k}_{label}"] = round(sum(values) / len(part), 4)
    return out


def _recall(rankings: list[list[str]], queries: list[Any], ks: list[int]) -> dict[str, float]:
    scored = [(ranked, q) for ranked, q in zip(rankings, queries, strict=True) if q.expected]
    out = {}
    for k in ks:
        total = sum(sum(1 for s in q.expected if s & set(ranked[:k])) / len(q.expected) for ranked, q in scored)
        out[f"recall@{k}"] = round(total / len(scored), 4)
    rr = 0.0
    for ranked, q in scored:
        relevant = set().union(*q.expected)
        rank = next((i for i, name in enumerate(ranked[:10], 1) if name in relevant), None)
        rr += 1 / rank if rank else 0.0
    out["mrr"] = round(rr / len(scored), 4)
    return out


def bm25_libraries(catalog: Path, queries_path: Path, ks: list[int]) -> list[dict[str, Any]]:
    """Our BM25 against bm25s: recall on the queries; index and query time at 527 and 10,000 tools."""
    import bm25s  # type: ignore[import-not-found]
    import numpy as np
    from router_latency import synthetic_catalog

    from gateway.router.bm25 import BM25Index
    from gateway.router.documents import tool_document
    from gateway.router.eval import load_catalog, load_queries

    records = sorted(load_catalog(catalog), key=lambda r: r.name)
    queries = load_queries(queries_path)
    depth = max(max(ks), 10)
    rows = []

    def ours(recs: list[Any]) -> tuple[Callable[[str], list[int]], float]:
        started = time.perf_counter()
        index = BM25Index.build([(r.name, tool_document(r)) for r in recs])
        built = time.perf_counter() - started

        def search(query: str) -> list[int]:
            scores = index.scores(query)
            order = np.lexsort((np.arange(len(scores)), -scores))[:depth]
            return [int(i) for i in order if scores[i] > 0]

        return search, built

    def library(recs: list[Any], our_tokens: bool) -> tuple[Callable[[str], list[int]], float]:
        started = time.perf_counter()
        documents = [tool_document(r) for r in recs]
        retriever = bm25s.BM25(k1=1.2, b=0.75)
        if our_tokens:
            retriever.index([tokenize(d) for d in documents], show_progress=False)
        else:
            retriever.index(bm25s.tokenize(documents, stopwords="en", show_progress=False), show_progress=False)
        built = time.perf_counter() - started

        def search(query: str) -> list[int]:
            if our_tokens:
                tokens = [tokenize(query)] if tokenize(query) else [["\0"]]
                ids, scores = retriever.retrieve(tokens, k=min(depth, len(recs)), show_progress=False, n_threads=1)
            else:
                tokenized = bm25s.tokenize([query], stopwords="en", show_progress=False)
                ids, scores = retriever.retrieve(tokenized, k=min(depth, len(recs)), show_progress=False, n_threads=1)
            return [int(i) for i, s in zip(ids[0], scores[0], strict=True) if s > 0]

        return search, built

    large = synthetic_catalog(records, 10_000)
    for label, make in (
        ("gateway.router.bm25 (numpy)", lambda recs: ours(recs)),
        ("bm25s, its tokenizer", lambda recs: library(recs, False)),
        ("bm25s, our tokenizer", lambda recs: library(recs, True)),
    ):
        search, built = make(records)
        rankings = [[records[i].name for i in search(q.query)] for q in queries]
        times = []
        for q in queries:
            started = time.perf_counter()
            search(q.query)
            times.append((time.perf_counter() - started) * 1000)
        large_search, large_built = make(large)
        large_times = []
        for q in queries:
            started = time.perf_counter()
            large_search(q.query)
            large_times.append((time.perf_counter() - started) * 1000)
        rows.append(
            {
                "library": label,
                **_recall(rankings, queries, ks),
                "index_527_ms": round(built * 1000, 1),
                "query_527_ms_p50": round(statistics.median(times), 3),
                "index_10000_ms": round(large_built * 1000, 1),
                "query_10000_ms_p50": round(statistics.median(large_times), 3),
            }
        )
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", type=Path, default=Path("../shared/eval/livemcpbench/catalog.json"))
    parser.add_argument("--queries", type=Path, default=Path("../shared/eval/livemcpbench/queries.jsonl"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names (default: all)")
    parser.add_argument("--k", default="1,5,10", help="comma-separated cut-offs")
    parser.add_argument("--lexical-gap", action="store_true", help="strip expected tools' name words from queries")
    parser.add_argument("--long", action="store_true", help="long requests joining 3-5 single-tool queries")
    parser.add_argument("--shared-vectors", action="store_true", help="embed each document once for all variants")
    parser.add_argument("--batch-size", type=int, default=None, help="embedder batch size (default: the setting's)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    parser.add_argument("--bm25-libraries", action="store_true", help="compare our BM25 with bm25s, then stop")
    args = parser.parse_args()

    if args.bm25_libraries:
        ks = [int(k) for k in args.k.split(",")]
        rows = bm25_libraries(args.catalog, args.queries, ks)
        for row in rows:
            print("  ".join(f"{key}={value}" for key, value in row.items()))
        if args.json:
            print(json.dumps({"bm25_libraries": rows}))
        return 0

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    ks = [int(k) for k in args.k.split(",")]

    from gateway.config.routing_settings import EmbeddingSettings
    from gateway.router.model_loading import load_embedder

    with tempfile.TemporaryDirectory(prefix="router-variants-") as tmp:
        settings = EmbeddingSettings() if args.batch_size is None else EmbeddingSettings(batch_size=args.batch_size)
        embedder = None
        if any(VARIANTS[v].fusion != "bm25" for v in names):
            embedder = load_embedder(settings, Path(tmp))
            if embedder is None:
                print("the embedding model could not be loaded", file=sys.stderr)
                return 1
        queries = args.queries
        if args.lexical_gap:
            queries = Path(tmp) / "lexical-gap.jsonl"
            lexical_gap_queries(args.queries, queries)
        if args.long:
            from gateway.router.eval import load_queries
            from gateway.router.long_requests import long_requests

            built = long_requests(load_queries(queries), seed=0)
            queries = Path(tmp) / "long.jsonl"
            queries.write_text(
                "".join(
                    json.dumps(
                        {
                            "id": q.id,
                            "query": q.query,
                            "expected": [
                                [dict(zip(("server", "tool"), n.split("__", 1), strict=True)) for n in sorted(a)]
                                for a in q.expected
                            ],
                        }
                    )
                    + "\n"
                    for q in built
                ),
                encoding="utf-8",
            )
        from gateway.router.eval_sets import SharedVectors

        shared = SharedVectors(None) if args.shared_vectors else None
        rows = []
        header = f"{'variant':18} {'router':44} " + " ".join(f"{'R@' + str(k):>6}" for k in ks)
        print(header + f" {'MRR':>6} {'index s':>8} {'p50 ms':>7}  R@5 even/odd  R@10 even/odd")
        for name in names:
            config = VARIANTS[name]
            started = time.perf_counter()
            model = None if config.fusion == "bm25" else embedder
            report = run_eval(args.catalog, queries, ks, model, config=config, cache=shared)
            split = halves(report)
            row = {"variant": name, **report.to_json(), **split, "seconds": round(time.perf_counter() - started, 2)}
            rows.append(row)
            recalls = " ".join(f"{report.recall[k]:6.3f}" for k in sorted(set(ks)))
            print(
                f"{name:18} {report.router:44} {recalls} {report.mrr:6.3f} "
                f"{report.index_seconds:8.2f} {report.search_ms_p50:7.2f}  "
                f"{split.get('recall@5_even', 0):.3f}/{split.get('recall@5_odd', 0):.3f}  "
                f"{split.get('recall@10_even', 0):.3f}/{split.get('recall@10_odd', 0):.3f}",
                flush=True,
            )
    if args.json:
        print(
            json.dumps(
                {"catalog": str(args.catalog), "lexical_gap": args.lexical_gap, "long": args.long, "variants": rows}
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
