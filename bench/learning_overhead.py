"""What learning from use costs a search, and what learning new signals costs.

    python bench/learning_overhead.py                   # figures on stdout
    python bench/learning_overhead.py --signals 100000  # more signals held
    python bench/learning_overhead.py --json            # and one JSON object as the last line

One `Router` indexes the LiveMCPBench catalog (527 tools) with the bundled model; it
learns `--signals` synthetic signals over `--queries` distinct requests (the benchmark's
requests, each with a numbered variant appended so that they are distinct; tools drawn at
random, values +1/-1, ages up to 60 days). Then every benchmark request is searched
`--rounds` times with and without what was learnt (`learned=True/False`), alternating
request by request in this process so that both see the same machine load; the report
gives the median of each, their ratio and difference. Finally the cost of learning:
`Router.learn` of all the signals at start (every request embedded, into an empty
embedding cache), of the same signals by a second router on the same cache (a restart),
and of 100 new signals with 20 new requests (their embedding included).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.router.cache import SqliteEmbeddingCache  # noqa: E402
from gateway.router.eval import load_catalog, load_queries  # noqa: E402
from gateway.router.index import Router  # noqa: E402
from gateway.router.learning import LearningConfig  # noqa: E402
from gateway.router.model_loading import load_embedder  # noqa: E402
from gateway.router.signals import UsageSignal  # noqa: E402

DATA = REPO.parent / "shared" / "eval" / "livemcpbench"


def synthetic_signals(requests: list[str], tools: list[str], n: int, distinct: int, seed: int) -> list[UsageSignal]:
    rng = random.Random(seed)
    now = time.time()
    queries = [f"{requests[i % len(requests)]} (variant {i})" for i in range(distinct)]
    return [
        UsageSignal(
            query=rng.choice(queries) if rng.random() > 0.1 else None,
            tool=rng.choice(tools),
            value=rng.choice((1.0, 1.0, 1.0, -1.0)),
            at=now - rng.uniform(0, 60) * 86_400,
            kind=rng.choice(("call", "feedback")),
        )
        for _ in range(n)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--catalog", type=Path, default=DATA / "catalog.json")
    parser.add_argument("--queries-file", type=Path, default=DATA / "queries.jsonl")
    parser.add_argument("--signals", type=int, default=20_000, help="signals learnt (default 20000)")
    parser.add_argument("--queries", type=int, default=2_000, help="distinct requests among them (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="searches of each request per variant (default 3)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data_dir:
        embedder = load_embedder(EmbeddingSettings(), Path(data_dir))
        assert embedder is not None, "the bundled model must load"
        records = load_catalog(args.catalog)
        requests = [q.query for q in load_queries(args.queries_file)]
        cache = SqliteEmbeddingCache(Path(data_dir) / "embeddings.sqlite")
        router = Router(embedder, cache=cache, learning=LearningConfig())
        router.update(records)
        signals = synthetic_signals(requests, [r.name for r in records], args.signals, args.queries, seed=0)
        started = time.perf_counter()
        router.learn(signals)
        learn_all = time.perf_counter() - started
        restarted = Router(embedder, cache=cache, learning=LearningConfig())
        restarted.update(records)
        started = time.perf_counter()
        restarted.learn(signals)
        learn_restart = time.perf_counter() - started

        for q in requests[:3]:  # warm-up
            router.search(q, k=8)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for i, q in enumerate(requests):
                for learned in (i % 2 == 0, i % 2 == 1):
                    t = time.perf_counter()
                    router.search(q, k=8, learned=learned)
                    times[learned].append((time.perf_counter() - t) * 1000)

        fresh = synthetic_signals(requests, [r.name for r in records], 100, 20, seed=1)
        fresh = [UsageSignal(f"{s.query} new" if s.query else None, s.tool, s.value, s.at, s.kind) for s in fresh]
        started = time.perf_counter()
        router.learn(fresh)
        learn_new = (time.perf_counter() - started) * 1000

    base, learned = statistics.median(times[False]), statistics.median(times[True])
    usage = router.usage
    assert usage is not None
    result = {
        "signals": len(usage),
        "distinct_queries": usage.queries,
        "searches_per_variant": len(times[False]),
        "search_ms_p50_without": round(base, 3),
        "search_ms_p50_with": round(learned, 3),
        "ratio": round(learned / base, 3),
        "added_ms": round(learned - base, 3),
        "learn_initial_seconds": round(learn_all, 2),
        "learn_restart_seconds": round(learn_restart, 2),
        "learn_100_new_signals_ms": round(learn_new, 1),
    }
    print(f"{result['signals']} signals over {result['distinct_queries']} distinct requests, 527 tools")
    print(
        f"search p50: {base:.3f} ms without learning, {learned:.3f} ms with"
        f" (x{result['ratio']:.2f}, {result['added_ms']:+.3f} ms), {len(times[False])} searches each"
    )
    print(
        f"learning them all: {learn_all:.2f} s at first start, {learn_restart:.2f} s after a restart (cache);"
        f" 100 new signals (20 new requests): {learn_new:.1f} ms"
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
