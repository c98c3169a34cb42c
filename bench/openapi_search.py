"""OpenAPI operation search: recall of `search_api(query=...)` on a real-world spec, and its cost.

    python bench/openapi_search.py            # figures on stdout
    python bench/openapi_search.py --json     # and one JSON object as the last line

The spec is tests/data/openapi/github-api-subset.json (354 operations of GitHub's REST
API) and the queries are tests/data/openapi/github-queries.tsv (plain-language
requests, one expected operationId each). Both rankings the plugin can serve are
measured on the same operations, in the same process: BM25 alone (no model) and the
default (bundled embedding model + BM25, the gateway router's `weighted` fusion).

Metrics: recall@1 and recall@5 (the expected operation among the first k results),
MRR over the first 10; index build time (cold: every operation embedded, empty
embedding cache; the model already loaded), and the median time of one search.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.config.settings import Settings  # noqa: E402
from gateway.router.index import Router  # noqa: E402
from gateway.router.model_loading import load_embedder  # noqa: E402
from plugins.openapi.search import build_router  # noqa: E402
from plugins.openapi.spec import ApiSpec, parse_document  # noqa: E402

SPEC = REPO / "tests" / "data" / "openapi" / "github-api-subset.json"
QUERIES = REPO / "tests" / "data" / "openapi" / "github-queries.tsv"


def load_queries(path: Path = QUERIES) -> list[tuple[str, str]]:
    """(query, expected operationId) pairs; `#` lines are comments."""
    pairs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            query, expected = line.split("\t")
            pairs.append((query.strip(), expected.strip()))
    return pairs


def load_spec(path: Path = SPEC) -> ApiSpec:
    return ApiSpec.build("github", parse_document(path.read_text(encoding="utf-8"), str(path)))


def evaluate(router: Router, queries: list[tuple[str, str]]) -> dict[str, float]:
    """recall@1, recall@5, MRR@10 and the median search time in ms."""
    ranks: list[int | None] = []
    times: list[float] = []
    router.search(queries[0][0], k=10)  # warm-up
    for query, expected in queries:
        started = time.perf_counter()
        names = [hit.name for hit in router.search(query, k=10)]
        times.append((time.perf_counter() - started) * 1000)
        ranks.append(names.index(expected) + 1 if expected in names else None)
    n = len(queries)
    return {
        "recall@1": sum(1 for r in ranks if r == 1) / n,
        "recall@5": sum(1 for r in ranks if r is not None and r <= 5) / n,
        "mrr@10": sum(1 / r for r in ranks if r is not None) / n,
        "search_ms_p50": statistics.median(times),
    }


def misses(router: Router, queries: list[tuple[str, str]], k: int = 5) -> list[str]:
    out = []
    for query, expected in queries:
        names = [hit.name for hit in router.search(query, k=k)]
        if expected not in names:
            out.append(f"{query!r}: expected {expected}, got {', '.join(names[:3])}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    spec = load_spec()
    queries = load_queries()
    pairs = list(spec.operations.values())
    print(f"{len(pairs)} operations, {len(queries)} queries")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        started = time.perf_counter()
        bm25 = build_router(pairs, None, None)
        results["bm25"] = evaluate(bm25, queries) | {"index_s": time.perf_counter() - started}
        embedder = load_embedder(EmbeddingSettings(), Path(data_dir))
        if embedder is None:
            sys.exit("the bundled embedding model did not load; see the log")
        started = time.perf_counter()
        dense = build_router(pairs, embedder, Settings(data_dir=Path(data_dir)))
        results["default"] = evaluate(dense, queries) | {"index_s": time.perf_counter() - started}
    for name, figures in results.items():
        print(
            f"{name:8} recall@1 {figures['recall@1']:.2f}  recall@5 {figures['recall@5']:.2f}  "
            f"MRR@10 {figures['mrr@10']:.2f}  search p50 {figures['search_ms_p50']:.1f} ms  "
            f"index {figures['index_s']:.2f} s"
        )
    for line in misses(dense, queries):
        print("  miss (default):", line)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
