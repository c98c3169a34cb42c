"""Router latency: search time with the query embedding, index build time cold and warm.

    python bench/router_latency.py                 # figures on stdout
    python bench/router_latency.py --json          # and one JSON object as the last line
    python bench/router_latency.py --batch-size 1  # the embedder's batch size (default: the setting's)

Measured, with the bundled embedding model loaded as the gateway loads it
(`load_embedder(EmbeddingSettings(), data_dir)`) and the default `RouterConfig`:

1. search at 527 tools (the LiveMCPBench catalog): every query of its queries file,
   `--rounds` times, timed around `Router.search` (query embedding included); the same
   with short queries (each query's first 6 words), and the embedding alone of the request
   as written (a search embeds `compact_query(request)`: section 5 times that);
   The index is enriched first (`Router.enrich`: the tools' full texts), as the gateway
   serves it once its background work is done; the enrichment time is reported;
2. cold index build of 2,500 tools (the first 2,500 of the synthetic catalog, below):
   `Router.update` with an empty `SqliteEmbeddingCache`, every short text embedded: the
   index is searchable from then on. Then `Router.enrich` of the same tools in a worker
   thread, as the gateway runs it in the background, while this thread searches (the
   queries of section 1, in turn): the enrichment time and the search latency meanwhile;
3. warm start of the same 2,500 tools: a new `Router` and a new `SqliteEmbeddingCache`
   on the same file, as after a restart (both texts' vectors read from SQLite, BM25
   rebuilt; nothing left to enrich);
4. search at 10,000 tools (the synthetic catalog; its remaining 7,500 short texts are
   embedded first, into the same cache; not enriched: the searched matrix has the same
   shape either way, so a search costs the same);
5. with `--compare`, the previous query path against the current one, interleaved query
   by query in this process (the machine is shared, so only same-moment comparisons
   mean much): the query embedding through fastembed with the request as written, run
   directly (`gateway.router.pooling`) with the request as written, and run directly
   with `compact_query(request)` (the default); and a whole search, previous
   (fastembed, request as written) against default. Then the embedding of the 2,500
   synthetic documents in chunks of 100, through fastembed and directly, alternating.

The synthetic catalog is deterministic: copy 0 is the real catalog, and copy i > 0 of
each real tool gets a server renamed `<server>-<edition>-<i>`, a tool name with an
edition suffix, and its description with a few words changed and an edition sentence,
so that every document differs (and is embedded) while staying realistic.

While a large index builds, a progress bar is drawn on stderr if stderr is a terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mcp_types as types  # noqa: E402

from gateway.router.base import Embedder, ToolRecord  # noqa: E402
from gateway.router.eval import load_catalog, load_queries  # noqa: E402
from gateway.router.index import Router  # noqa: E402
from gateway.router.progress import TerminalProgress  # noqa: E402

EDITIONS = [
    "cloud", "local", "team", "enterprise", "lite", "pro", "legacy", "beta",
    "mirror", "regional", "sandbox", "community", "secure", "fast", "archive", "edge",
]  # fmt: skip
SWAPS = {
    "get": "fetch", "list": "enumerate", "create": "make", "search": "look up", "delete": "remove",
    "update": "modify", "read": "load", "write": "store", "file": "document", "the": "a given",
}  # fmt: skip


def synthetic_catalog(records: Sequence[ToolRecord], size: int, seed: int = 0) -> list[ToolRecord]:
    """`size` tool records: the real ones, then perturbed copies of them (deterministic)."""
    rng = random.Random(seed)
    out: list[ToolRecord] = []
    for i in range(size):
        base = records[i % len(records)]
        copy = i // len(records)
        if copy == 0:
            out.append(base)
            continue
        edition = rng.choice(EDITIONS)
        server = f"{base.server_name}-{edition}-{copy}"
        original = f"{base.original_name}_{edition}"
        name = f"{server}__{original}"
        words = (base.tool.description or "").split()
        for j, word in enumerate(words):
            swap = SWAPS.get(word.lower())
            if swap is not None and rng.random() < 0.5:
                words[j] = swap
        description = f"{' '.join(words)} ({edition.capitalize()} edition {copy}, region {rng.randint(1, 99)}.)"
        tool = types.Tool(name=name, description=description, input_schema=base.tool.input_schema)
        out.append(
            ToolRecord(
                name=name,
                server_id=server,
                tool=tool,
                original_name=original,
                server_name=server,
                server_description=f"{base.server_description} {edition.capitalize()} edition.",
                capabilities=base.capabilities,
            )
        )
    return out


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency(times: Sequence[float]) -> dict[str, float]:
    """p50/p95 in ms (0 when there are none) and the count of `times`, in ms."""
    if not times:
        return {"p50_ms": 0.0, "p95_ms": 0.0, "n": 0}
    return {"p50_ms": round(statistics.median(times), 3), "p95_ms": round(percentile(times, 95), 3), "n": len(times)}


def print_latencies(results: dict[str, object], keys: Sequence[str], width: int = 18) -> None:
    for key in keys:
        r = results[key]
        assert isinstance(r, dict)
        print(f"  {key:{width}} p50 {r['p50_ms']:6.2f} ms  p95 {r['p95_ms']:6.2f} ms  (n={r['n']})")


def timed(calls: Sequence[Callable[[], object]]) -> dict[str, float]:
    """p50/p95 in ms of the calls, each run once, after 3 warm-up calls."""
    for call in calls[:3]:
        call()
    times = []
    for call in calls:
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return latency(times)


def interleaved(variants: dict[str, Callable[[str], object]], texts: Sequence[str]) -> dict[str, dict[str, float]]:
    """p50/p95 in ms of each variant over `texts`, the variants taking turns on each text."""
    for text in texts[:3]:
        for call in variants.values():
            call(text)
    times: dict[str, list[float]] = {name: [] for name in variants}
    for i, text in enumerate(texts):
        names = list(variants) if i % 2 == 0 else list(reversed(variants))
        for name in names:
            started = time.perf_counter()
            variants[name](text)
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: latency(t) for name, t in times.items()}


def compare_paths(
    embedder: Embedder,
    records: Sequence[ToolRecord],
    queries: Sequence[str],
    documents: Sequence[ToolRecord],
    rounds: int,
) -> dict[str, object]:
    """Section 5: the previous query path (fastembed, request as written) against the current one."""
    from gateway.router.documents import dense_document
    from gateway.router.embedder import FastEmbedEmbedder
    from gateway.router.query import compact_query
    from gateway.router.router_config import RouterConfig

    if not isinstance(embedder, FastEmbedEmbedder) or not embedder.direct:
        return {"skipped": "the embedder has no direct path"}

    def through(direct: bool, call: Callable[[str], object]) -> Callable[[str], object]:
        def run(text: str) -> object:
            embedder.direct = direct
            try:
                return call(text)
            finally:
                embedder.direct = True

        return run

    previous = Router(embedder, config=RouterConfig(query_text="raw"))
    previous.update(records)
    current = Router(embedder)
    current.update(records)
    texts = list(queries) * rounds
    out: dict[str, object] = {
        "embed_query": interleaved(
            {
                "fastembed, as written": through(False, embedder.embed_query),
                "direct, as written": through(True, embedder.embed_query),
                "direct, compact_query": through(True, lambda q: embedder.embed_query(compact_query(q))),
            },
            texts,
        ),
        "search_527": interleaved(
            {
                "previous (fastembed, as written)": through(False, lambda q: previous.search(q, k=8)),
                "default (direct, compact_query)": through(True, lambda q: current.search(q, k=8)),
            },
            texts,
        ),
    }
    texts_2500 = sorted((dense_document(r) for r in documents), key=len)
    chunks = [texts_2500[i : i + 100] for i in range(0, len(texts_2500), 100)]
    seconds = {"fastembed": 0.0, "direct": 0.0}
    for i, chunk in enumerate(chunks):
        for name in ("fastembed", "direct") if i % 2 == 0 else ("direct", "fastembed"):
            embedder.direct = name == "direct"
            started = time.perf_counter()
            for start in range(0, len(chunk), 32):
                embedder.embed_documents(chunk[start : start + 32])
            seconds[name] += time.perf_counter() - started
    embedder.direct = True
    out["embed_2500_documents_s"] = {name: round(value, 2) for name, value in seconds.items()}
    for section in ("embed_query", "search_527"):
        table = out[section]
        assert isinstance(table, dict)
        for name, r in table.items():
            print(f"  {section:12} {name:34} p50 {r['p50_ms']:6.2f} ms  p95 {r['p95_ms']:6.2f} ms  (n={r['n']})")
    print(f"  embedding 2,500 documents: {out['embed_2500_documents_s']}")
    return out


def enrich_2500(router: Router, queries: Sequence[str], results: dict[str, object]) -> None:
    """Section 2's enrichment in a worker thread, with searches in this thread meanwhile."""
    import threading

    done: list[int] = []
    started = time.perf_counter()
    worker = threading.Thread(target=lambda: done.append(router.enrich()), name="enrich")
    worker.start()
    times: list[float] = []
    while worker.is_alive():
        for query in queries:
            if not worker.is_alive():
                break
            began = time.perf_counter()
            router.search(query, k=8)
            times.append((time.perf_counter() - began) * 1000)
    worker.join()
    results["enrich_2500_s"] = round(time.perf_counter() - started, 3)
    results["enrich_2500_embedded"] = done[0] if done else 0
    results["search_2500_while_enriching"] = latency(times)
    results["search_2500_enriched"] = timed([lambda q=q: router.search(q, k=8) for q in queries])


def progress_bar(label: str) -> TerminalProgress:
    return TerminalProgress(label, minimum=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--catalog", type=Path, default=Path("../shared/eval/livemcpbench/catalog.json"))
    parser.add_argument("--queries", type=Path, default=Path("../shared/eval/livemcpbench/queries.jsonl"))
    parser.add_argument("--rounds", type=int, default=3, help="times each query is searched (default 3)")
    parser.add_argument("--cold-tools", type=int, default=2500)
    parser.add_argument("--large-tools", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=None, help="embedder batch size (default: the setting's)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    parser.add_argument("--compare", action="store_true", help="also compare the previous query path (section 5)")
    args = parser.parse_args()

    from gateway.config.routing_settings import EmbeddingSettings
    from gateway.router.cache import SqliteEmbeddingCache
    from gateway.router.model_loading import load_embedder

    settings = EmbeddingSettings() if args.batch_size is None else EmbeddingSettings(batch_size=args.batch_size)
    results: dict[str, object] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "embedder_batch_size": settings.batch_size,
    }
    records = load_catalog(args.catalog)
    queries = [q.query for q in load_queries(args.queries)]
    short = [" ".join(q.split()[:6]) for q in queries]

    with tempfile.TemporaryDirectory(prefix="router-latency-") as tmp:
        data_dir = Path(tmp)
        started = time.perf_counter()
        embedder: Embedder | None = load_embedder(settings, data_dir)
        if embedder is None:
            print("the embedding model could not be loaded", file=sys.stderr)
            return 1
        results["model_load_s"] = round(time.perf_counter() - started, 3)
        print(f"model {embedder.model_id} loaded in {results['model_load_s']:.2f} s (batch size {settings.batch_size})")

        # 1. 527 tools
        router = Router(embedder)
        started = time.perf_counter()
        router.update(records, progress=progress_bar(f"indexing {len(records)} tools"))
        results["index_527_cold_s"] = round(time.perf_counter() - started, 3)
        started = time.perf_counter()
        router.enrich(progress=progress_bar(f"embedding {len(records)} full texts"))
        results["enrich_527_s"] = round(time.perf_counter() - started, 3)
        results["search_527"] = timed([lambda q=q: router.search(q, k=8) for q in queries * args.rounds])
        results["search_527_short"] = timed([lambda q=q: router.search(q, k=8) for q in short * args.rounds])
        results["embed_query"] = timed([lambda q=q: embedder.embed_query(q) for q in queries * args.rounds])
        results["embed_query_short"] = timed([lambda q=q: embedder.embed_query(q) for q in short * args.rounds])
        print(
            f"{len(records)} tools: cold index {results['index_527_cold_s']:.2f} s,"
            f" full texts {results['enrich_527_s']:.2f} s more"
        )
        print_latencies(results, ("search_527", "search_527_short", "embed_query", "embed_query_short"))

        # 2. + 3. cold and warm 2,500
        synthetic = synthetic_catalog(records, max(args.cold_tools, args.large_tools))
        cache_path = data_dir / "embeddings.sqlite"
        cold = Router(embedder, cache=SqliteEmbeddingCache(cache_path))
        started = time.perf_counter()
        cold.update(synthetic[: args.cold_tools], progress=progress_bar(f"indexing {args.cold_tools} tools"))
        results["index_2500_cold_s"] = round(time.perf_counter() - started, 3)
        results["index_2500_embedded"] = cold.embedded_documents
        enrich_2500(cold, queries * args.rounds, results)
        warm = Router(embedder, cache=SqliteEmbeddingCache(cache_path))
        started = time.perf_counter()
        warm.update(synthetic[: args.cold_tools])
        results["index_2500_warm_s"] = round(time.perf_counter() - started, 3)
        results["index_2500_warm_embedded"] = warm.embedded_documents
        results["index_2500_warm_pending"] = warm.pending_documents
        print(
            f"{args.cold_tools} tools: cold index {results['index_2500_cold_s']:.2f} s "
            f"({results['index_2500_embedded']} embedded), full texts {results['enrich_2500_s']:.1f} s more "
            f"({results['enrich_2500_embedded']} embedded), warm start {results['index_2500_warm_s']:.3f} s "
            f"({warm.embedded_documents} embedded, {warm.pending_documents} left to enrich)"
        )
        print_latencies(results, ("search_2500_while_enriching", "search_2500_enriched"), width=27)

        # 4. 10,000
        large = Router(embedder, cache=SqliteEmbeddingCache(cache_path))
        started = time.perf_counter()
        large.update(synthetic[: args.large_tools], progress=progress_bar(f"indexing {args.large_tools} tools"))
        results["index_10000_s_with_2500_cached"] = round(time.perf_counter() - started, 3)
        results["search_10000"] = timed([lambda q=q: large.search(q, k=8) for q in queries * args.rounds])
        results["search_10000_short"] = timed([lambda q=q: large.search(q, k=8) for q in short * args.rounds])
        print(f"{len(large)} tools: index {results['index_10000_s_with_2500_cached']:.1f} s (2,500 of them cached)")
        print_latencies(results, ("search_10000", "search_10000_short"))
        if args.compare:
            results["compare"] = compare_paths(embedder, records, queries, synthetic[: args.cold_tools], args.rounds)
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    results["router"] = router.description
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
