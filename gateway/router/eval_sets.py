"""The router measured on several sets at once, beside plain baselines, and the worst set.

A router tuned on one set can lose on the next one (issue 20: +0.07 recall@5 on
LiveMCPBench, less than a plain fusion elsewhere). So `mcp-gateway eval` takes several
sets and runs, on each, the router and three plain baselines over the same documents,
the same vectors and the same model, in the same process:

- `bm25`: BM25 alone;
- `dense`: the cosine alone, the request embedded as written;
- `rrf`: reciprocal rank fusion (k=60) of those two.

For each variant it reports every set and the worst set of each figure: a default is
chosen by its worst set, never by one set's mean. The vectors are embedded once and
shared by the variants (an in-memory layer over the embedding cache); only the router's
own row times a build and searches with a fresh query embedding (the dense baselines'
latency is not reported; BM25's is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.router.base import Embedder, EmbeddingCache, Matrix, ToolRecord, Vector
from gateway.router.eval import EvalQuery, EvalReport, evaluate, load_catalog, load_queries
from gateway.router.router_config import RouterConfig

__all__ = ["BASELINES", "EvalSet", "MultiReport", "SharedVectors", "format_multi_report", "load_set", "run_sets"]

ROUTER = "router"
"""The name of the router's own row (the configuration under test)."""

BASELINES: Mapping[str, RouterConfig] = {
    "bm25": RouterConfig(fusion="bm25", split="off"),
    "dense": RouterConfig(fusion="dense", query_text="raw", split="off"),
    "rrf": RouterConfig(fusion="rrf", rrf_k=60, query_text="raw", split="off"),
}
"""The plain baselines run beside the router on every set."""


@dataclass(frozen=True)
class EvalSet:
    """One catalog and its requests, under a short name (the folder's, by default)."""

    name: str
    records: Sequence[ToolRecord]
    queries: Sequence[EvalQuery]


def load_set(catalog: Path, queries: Path, name: str | None = None) -> EvalSet:
    """A set from its two files; named after the queries' folder unless `name` is given."""
    return EvalSet(
        name=name or queries.resolve().parent.name or queries.stem,
        records=load_catalog(catalog),
        queries=load_queries(queries),
    )


class SharedVectors:
    """An embedding cache that keeps every vector in memory too, over an optional backing one,
    so the variants of one run embed each document once."""

    def __init__(self, backing: EmbeddingCache | None) -> None:
        self._backing = backing
        self._memory: dict[str, Vector] = {}

    def get_many(self, keys: Sequence[str]) -> dict[str, Vector]:
        found = {k: self._memory[k] for k in keys if k in self._memory}
        missing = [k for k in keys if k not in found]
        if missing and self._backing is not None:
            more = self._backing.get_many(missing)
            self._memory.update(more)
            found.update(more)
        return found

    def put_many(self, items: Mapping[str, Vector]) -> None:
        self._memory.update(items)
        if self._backing is not None:
            self._backing.put_many(items)


class _QueryMemo:
    """The embedder with its query vectors remembered: the baselines do not re-embed a
    request another variant has embedded (their latency is not what is measured)."""

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._queries: dict[str, Vector] = {}

    @property
    def model_id(self) -> str:
        return self._embedder.model_id

    @property
    def dim(self) -> int:
        return self._embedder.dim

    def embed_documents(self, texts: Sequence[str]) -> Matrix:
        return self._embedder.embed_documents(texts)

    def embed_query(self, text: str) -> Vector:
        if text not in self._queries:
            self._queries[text] = self._embedder.embed_query(text)
        return self._queries[text]


@dataclass
class MultiReport:
    """Per set, one report per variant (the router first), and the worst set of each figure."""

    ks: tuple[int, ...]
    sets: dict[str, dict[str, EvalReport]] = field(default_factory=dict)

    @property
    def variants(self) -> list[str]:
        names: dict[str, None] = {}
        for reports in self.sets.values():
            names.update(dict.fromkeys(reports))
        return list(names)

    def worst(self, variant: str) -> dict[str, tuple[float, str]]:
        """Each figure's lowest value over the sets, and the set it comes from."""
        out: dict[str, tuple[float, str]] = {}
        for set_name, reports in self.sets.items():
            report = reports.get(variant)
            if report is None or not report.queries:
                continue
            figures = {f"recall@{k}": report.recall[k] for k in self.ks}
            figures["mrr"] = report.mrr
            for key, value in figures.items():
                if key not in out or value < out[key][0]:
                    out[key] = (value, set_name)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "sets": {name: {v: r.to_json() for v, r in reports.items()} for name, reports in self.sets.items()},
            "worst": {
                v: {key: {"value": round(value, 4), "set": where} for key, (value, where) in self.worst(v).items()}
                for v in self.variants
            },
        }


def run_sets(
    sets: Sequence[EvalSet],
    ks: Sequence[int],
    embedder: Embedder | None,
    threshold: float = 0.0,
    *,
    config: RouterConfig | None = None,
    baselines: bool = True,
    cache: EmbeddingCache | None = None,
) -> MultiReport:
    """The router (`config`, default `RouterConfig()`) and, with `baselines`, the plain
    baselines on every set. `cache` backs the shared vectors (None: embed everything)."""
    report = MultiReport(ks=tuple(sorted({int(k) for k in ks})))
    shared = SharedVectors(cache)
    memo = _QueryMemo(embedder) if embedder is not None else None
    for s in sets:
        if s.name in report.sets:
            raise ValueError(f"two sets are named {s.name!r}")
        rows: dict[str, EvalReport] = {}
        rows[ROUTER] = evaluate(s.records, s.queries, ks, embedder, threshold, config=config, cache=shared)
        if baselines:
            for name, baseline in BASELINES.items():
                model = None if baseline.fusion == "bm25" else memo
                if model is None and baseline.fusion != "bm25":
                    continue  # no embedder: the dense baselines are BM25 again
                rows[name] = evaluate(s.records, s.queries, ks, model, threshold, config=baseline, cache=shared)
                if model is not None:
                    rows[name].search_ms = []  # remembered query vectors: its latency is not measured
        report.sets[s.name] = rows
    return report


def format_multi_report(report: MultiReport) -> str:
    """One table: a row per set and variant, then the worst set per variant."""
    ks = report.ks
    head = f"{'set':<16} {'variant':<8} " + " ".join(f"{'r@' + str(k):>6}" for k in ks)
    head += f" {'mrr':>6}   {'r@5 halves':<13} {'p50 ms':>7} {'p95 ms':>7}  queries"
    lines = [head]
    for set_name, reports in report.sets.items():
        for variant, r in reports.items():
            halves = r.halves.get(5)
            row = f"{set_name:<16} {variant:<8} " + " ".join(f"{r.recall[k]:>6.3f}" for k in ks)
            row += f" {r.mrr:>6.3f}   " + (f"{halves[0]:.3f} / {halves[1]:.3f}" if halves else " " * 13)
            timing = f"{r.search_ms_p50:>7.2f} {r.search_ms_p95:>7.2f}" if r.search_ms else f"{'-':>7} {'-':>7}"
            row += f" {timing}  {r.queries}"
            lines.append(row)
    for variant in report.variants:
        worst = report.worst(variant)
        if not worst:
            continue
        cells = [f"{worst[f'recall@{k}'][0]:>6.3f}" for k in ks] + [f"{worst['mrr'][0]:>6.3f}"]
        where = ", ".join(f"{key}: {where}" for key, (_, where) in worst.items())
        lines.append(f"{'worst':<16} {variant:<8} " + " ".join(cells) + f"   ({where})")
    routers = {r.router for reports in report.sets.values() for v, r in reports.items() if v == ROUTER}
    lines.append("router: " + ", ".join(sorted(routers)))
    return "\n".join(lines)
