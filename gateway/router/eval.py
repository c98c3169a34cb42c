"""Retrieval evaluation of the router: `mcp-gateway eval --catalog C.json --queries Q.jsonl`.

The catalog is indexed by the same `Router` the server uses, through `ToolRecord`s.

Files:

- catalog: `{"servers": [{"name", "description", "tools": [{"name", "description",
  "inputSchema"}]}]}` (a server may also carry `"capabilities": [..]`);
- queries: JSON lines `{"id", "query", "expected": [[{"server", "tool"}, ...], ...]}`:
  one inner list per tool the task needs, any alternative in it counts.

Metrics:

- recall@k: a query scores the fraction of its expected sets that are hit, a set being
  hit when any of its alternatives is among the first k results; recall@k is the mean
  over queries whose `expected` is not empty;
- MRR: the mean over the same queries of 1 / rank of the first result that belongs to
  any expected set, looking at the first max(10, max k) results (0 if none is there);
- empty_expected_none_rate: among queries whose `expected` is `[]` (nothing in the
  catalog fits), the fraction for which no result passes the threshold;
- index_seconds: the time of one `Router.update`, the model already loaded: from then
  on the index is searchable. Cold when `cached_documents` is 0: `mcp-gateway eval`
  reuses the data dir's embedding cache from run to run unless `--cold`;
- enrich_seconds: the time of the `Router.enrich` that follows (the tools' full texts,
  embedded in the background by the gateway); recall is measured after it;
- search_ms_p50/p95: the time of one `Router.search` including the query embedding,
  after one warm-up search;
- halves: recall@k on the queries at even and at odd lines, a check that a change helps
  on both rather than on a few queries.

Several sets at once, with plain baselines beside the router and the worst set of each:
`gateway.router.eval_sets`.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcp_types as types

from gateway.router.base import Embedder, EmbeddingCache, ToolRecord
from gateway.router.index import Router
from gateway.router.router_config import RouterConfig

__all__ = [
    "MRR_DEPTH",
    "EvalQuery",
    "EvalReport",
    "evaluate",
    "format_report",
    "load_catalog",
    "load_queries",
    "run_eval",
    "score_ranking",
]

MRR_DEPTH = 10


def exposed_name(server: str, tool: str) -> str:
    return f"{server}__{tool}"


def load_catalog(path: Path) -> list[ToolRecord]:
    """The catalog file's tools as the records the gateway would index."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    records: list[ToolRecord] = []
    seen: set[str] = set()
    for server in data["servers"]:
        server_name = str(server["name"])
        capabilities = tuple(str(c) for c in server.get("capabilities") or ())
        for tool in server.get("tools") or ():
            name = exposed_name(server_name, str(tool["name"]))
            if name in seen:
                continue
            seen.add(name)
            exposed = types.Tool(
                name=name,
                description=tool.get("description") or None,
                input_schema=tool.get("inputSchema") or {"type": "object"},
            )
            records.append(
                ToolRecord(
                    name=name,
                    server_id=server_name,
                    tool=exposed,
                    original_name=str(tool["name"]),
                    server_name=server_name,
                    server_description=str(server.get("description") or ""),
                    capabilities=capabilities,
                )
            )
    return records


@dataclass(frozen=True)
class EvalQuery:
    id: str
    query: str
    expected: tuple[frozenset[str], ...]
    """One set of acceptable exposed names per needed tool."""


def load_queries(path: Path) -> list[EvalQuery]:
    queries: list[EvalQuery] = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        item = json.loads(line)
        expected = tuple(
            frozenset(exposed_name(str(a["server"]), str(a["tool"])) for a in alternatives)
            for alternatives in item.get("expected") or ()
        )
        queries.append(EvalQuery(id=str(item.get("id", number)), query=str(item["query"]), expected=expected))
    return queries


@dataclass
class EvalReport:
    ks: tuple[int, ...]
    recall: dict[int, float]
    mrr: float
    index_seconds: float
    enrich_seconds: float
    search_ms: list[float]
    queries: int
    """Queries with a non-empty `expected` (the ones recall and MRR average over)."""
    empty_expected: int
    empty_expected_none_rate: float | None
    router: str
    tools: int
    missing_expected: list[str] = field(default_factory=list)
    """Expected tools that are not in the catalog (they can never be hit)."""
    per_query: list[dict[str, Any]] = field(default_factory=list)
    halves: dict[int, tuple[float, float]] = field(default_factory=dict)
    """recall@k on the queries at even and at odd lines (0-based) of the file: a change
    should help on both halves, not on a few queries."""
    cached_documents: int = 0
    """Documents whose vectors came from the embedding cache: when > 0, `index_seconds`
    and `enrich_seconds` are not a cold build."""

    @property
    def search_ms_p50(self) -> float:
        return statistics.median(self.search_ms) if self.search_ms else 0.0

    @property
    def search_ms_p95(self) -> float:
        return _percentile(self.search_ms, 95)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {f"recall@{k}": round(self.recall[k], 4) for k in self.ks}
        out.update(
            mrr=round(self.mrr, 4),
            index_seconds=round(self.index_seconds, 3),
            enrich_seconds=round(self.enrich_seconds, 3),
            search_ms_p50=round(self.search_ms_p50, 3),
            search_ms_p95=round(self.search_ms_p95, 3),
            queries=self.queries,
            empty_expected_none_rate=(
                None if self.empty_expected_none_rate is None else round(self.empty_expected_none_rate, 4)
            ),
            empty_expected=self.empty_expected,
            router=self.router,
            cached_documents=self.cached_documents,
        )
        out.update({f"recall@{k}_halves": [round(h, 4) for h in self.halves[k]] for k in self.ks if k in self.halves})
        return out


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def score_ranking(
    ranked: Sequence[str], expected: Sequence[frozenset[str]], ks: Sequence[int]
) -> tuple[dict[int, float], float]:
    """recall@k for each k, and the reciprocal rank, of one ranking (see the module docstring)."""
    recall = {k: sum(1 for alternatives in expected if alternatives & set(ranked[:k])) / len(expected) for k in ks}
    relevant = set().union(*expected)
    rank = next((i for i, name in enumerate(ranked[: max(max(ks), MRR_DEPTH)], 1) if name in relevant), None)
    return recall, 1.0 / rank if rank else 0.0


def run_eval(
    catalog_path: Path,
    queries_path: Path,
    ks: Sequence[int],
    embedder: Embedder | None,
    threshold: float = 0.0,
    *,
    config: RouterConfig | None = None,
    cache: EmbeddingCache | None = None,
) -> EvalReport:
    """Index the catalog in a `Router` and measure recall@k, MRR and latency on the queries.

    `config` selects a ranking variant (default: the router's default). `cache` is for
    repeated experiments only: with it, `index_seconds` is no longer a cold build.
    """
    return evaluate(
        load_catalog(catalog_path),
        load_queries(queries_path),
        ks,
        embedder,
        threshold,
        config=config,
        cache=cache,
    )


def evaluate(
    records: Sequence[ToolRecord],
    queries: Sequence[EvalQuery],
    ks: Sequence[int],
    embedder: Embedder | None,
    threshold: float = 0.0,
    *,
    config: RouterConfig | None = None,
    cache: EmbeddingCache | None = None,
) -> EvalReport:
    """`run_eval` on a catalog and queries already loaded (the multi-set eval shares them)."""
    ks = tuple(sorted({int(k) for k in ks}))
    if not ks or ks[0] < 1:
        raise ValueError("ks must be positive integers")
    names = {r.name for r in records}
    missing = sorted({name for q in queries for s in q.expected for name in s if name not in names})

    router = Router(embedder, cache=cache, config=config)
    started = time.perf_counter()
    router.update(records)
    index_seconds = time.perf_counter() - started
    started = time.perf_counter()
    router.enrich()
    enrich_seconds = time.perf_counter() - started

    depth = max(max(ks), MRR_DEPTH)
    if queries:
        router.search(queries[0].query, k=depth, threshold=threshold)  # warm-up
    recall_sums = dict.fromkeys(ks, 0.0)
    halves = {k: ([0.0, 0.0], [0, 0]) for k in ks}
    rr_sum = 0.0
    scored = 0
    empty = 0
    empty_none = 0
    latencies: list[float] = []
    per_query: list[dict[str, Any]] = []
    for line, q in enumerate(queries):
        started = time.perf_counter()
        hits = router.search(q.query, k=depth, threshold=threshold)
        latencies.append((time.perf_counter() - started) * 1000)
        ranked = [h.name for h in hits]
        if not q.expected:
            empty += 1
            empty_none += not ranked
            per_query.append({"id": q.id, "results": ranked[: max(ks)]})
            continue
        scored += 1
        recall, rr = score_ranking(ranked, q.expected, ks)
        for k in ks:
            recall_sums[k] += recall[k]
            sums, counts = halves[k]
            sums[line % 2] += recall[k]
            counts[line % 2] += 1
        rr_sum += rr
        entry: dict[str, Any] = {"id": q.id, "results": ranked[: max(ks)]}
        entry.update({f"recall@{k}": recall[k] for k in ks}, rr=rr)
        per_query.append(entry)

    return EvalReport(
        ks=ks,
        recall={k: recall_sums[k] / scored if scored else 0.0 for k in ks},
        mrr=rr_sum / scored if scored else 0.0,
        index_seconds=index_seconds,
        enrich_seconds=enrich_seconds,
        search_ms=latencies,
        queries=scored,
        empty_expected=empty,
        empty_expected_none_rate=(empty_none / empty) if empty else None,
        router=router.description,
        tools=len(records),
        missing_expected=missing,
        per_query=per_query,
        halves={
            k: (sums[0] / counts[0] if counts[0] else 0.0, sums[1] / counts[1] if counts[1] else 0.0)
            for k, (sums, counts) in halves.items()
        },
        cached_documents=router.cached_documents,
    )


def format_report(report: EvalReport) -> str:
    """A few human-readable lines."""
    lines = [
        f"router: {report.router}",
        f"tools: {report.tools}  queries: {report.queries}"
        + (f" (+{report.empty_expected} with no expected tool)" if report.empty_expected else ""),
    ]
    lines.append("  ".join(f"recall@{k}: {report.recall[k]:.3f}" for k in report.ks) + f"  mrr: {report.mrr:.3f}")
    if report.empty_expected_none_rate is not None:
        lines.append(f"no-answer queries with nothing above the threshold: {report.empty_expected_none_rate:.1%}")
    lines.append(
        f"index build: {report.index_seconds:.2f} s (+ {report.enrich_seconds:.2f} s of full texts"
        + (f"; {report.cached_documents} vectors from the embedding cache" if report.cached_documents else "")
        + ")"
        f"   search: p50 {report.search_ms_p50:.2f} ms,"
        f" p95 {report.search_ms_p95:.2f} ms"
    )
    if report.missing_expected:
        shown = ", ".join(report.missing_expected[:5])
        more = f" (+{len(report.missing_expected) - 5} more)" if len(report.missing_expected) > 5 else ""
        lines.append(f"warning: {len(report.missing_expected)} expected tools are not in the catalog: {shown}{more}")
    return "\n".join(lines)
