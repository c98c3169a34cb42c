"""Does the router say "no tool fits" when none does? `mcp-gateway eval --abstain`.

A router that always answers pushes the model into calling something wrong. The gateway
answers "no tool fits this request" (the closest tools as hints, not matches) when its
best result scores under `routing.no_fit_threshold`. The check works on any labelled set:
for each request, the servers of its expected tools are hidden from the ranking, so no
tool in what is left was meant for it; the request is a *false accept* when the best tool
left still scores at least the threshold. The price is measured on the same requests
unhidden: the recall@5 of the requests whose best result falls under the threshold (their
tools become hints). Requests whose `expected` is `[]` are measured as they are.

One search per request (all tools ranked) gives both figures for every threshold of a
grid, so the report shows the whole trade-off and the threshold it would pick: the
lowest false-accept rate, on the worst set, among thresholds losing at most
`MAX_RECALL_LOST` recall@5 on every set. Hiding drops the tools from the ranking; the
index statistics (BM25's idf) stay those of the whole catalog.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.router.base import Embedder, EmbeddingCache, ToolRecord
from gateway.router.eval import EvalQuery
from gateway.router.index import Router
from gateway.router.router_config import RouterConfig

__all__ = ["GRID", "MAX_RECALL_LOST", "AbstainReport", "format_abstain", "pick_threshold", "run_abstain"]

GRID: tuple[float, ...] = tuple(round(0.05 + 0.01 * i, 3) for i in range(36))
"""Thresholds measured: 0.05 to 0.40 by 0.01."""

MAX_RECALL_LOST = 0.02
RECALL_AT = 5


@dataclass
class AbstainReport:
    """False accepts and recall lost per threshold, on one set."""

    name: str
    thresholds: tuple[float, ...]
    false_accept: dict[float, float]
    """Per threshold: the share of hidden requests with a result at or above it."""
    recall_lost: dict[float, float]
    """Per threshold: the recall@5 (over all requests) of the unhidden requests whose best
    result scores under it, answered "no tool fits"."""
    empty_accept: dict[float, float] = field(default_factory=dict)
    """Per threshold: the share of `"expected": []` requests with a result at or above it."""
    requests: int = 0
    empty_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "empty_requests": self.empty_requests,
            "thresholds": {
                f"{t:g}": {
                    "false_accept": round(self.false_accept[t], 4),
                    "recall@5_lost": round(self.recall_lost[t], 4),
                    **({"empty_accept": round(self.empty_accept[t], 4)} if self.empty_requests else {}),
                }
                for t in self.thresholds
            },
        }


def run_abstain(
    name: str,
    records: Sequence[ToolRecord],
    queries: Sequence[EvalQuery],
    embedder: Embedder | None,
    *,
    config: RouterConfig | None = None,
    cache: EmbeddingCache | None = None,
    thresholds: Sequence[float] = GRID,
) -> AbstainReport:
    """The abstention figures of the router (`config`) on one set (see the module docstring)."""
    router = Router(embedder, cache=cache, config=config)
    router.update(records)
    router.enrich()
    server_of = {r.name: r.server_id for r in records}
    ts = tuple(sorted(thresholds))
    accepted = dict.fromkeys(ts, 0)
    empty_accepted = dict.fromkeys(ts, 0)
    lost = dict.fromkeys(ts, 0.0)
    requests = empties = 0
    for q in queries:
        hits = router.search(q.query, k=len(records), learned=False)
        hidden = {server_of[n] for alternatives in q.expected for n in alternatives if n in server_of}
        best_left = next((h.score for h in hits if h.record.server_id not in hidden), 0.0)
        if not q.expected:
            empties += 1
            for t in ts:
                empty_accepted[t] += best_left >= t
            continue
        requests += 1
        top = {h.name for h in hits[:RECALL_AT]}
        recall = sum(1 for a in q.expected if a & top) / len(q.expected)
        best = hits[0].score if hits else 0.0
        for t in ts:
            accepted[t] += best_left >= t
            lost[t] += recall if best < t else 0.0
    return AbstainReport(
        name=name,
        thresholds=ts,
        false_accept={t: accepted[t] / requests if requests else 0.0 for t in ts},
        recall_lost={t: lost[t] / requests if requests else 0.0 for t in ts},
        empty_accept={t: empty_accepted[t] / empties for t in ts} if empties else {},
        requests=requests,
        empty_requests=empties,
    )


def pick_threshold(reports: Sequence[AbstainReport], max_lost: float = MAX_RECALL_LOST) -> float | None:
    """The threshold with the lowest worst-set false-accept rate among those losing at most
    `max_lost` recall@5 on every set (the lowest such threshold on a tie); None if none does."""
    if not reports:
        return None
    fitting = [t for t in reports[0].thresholds if all(r.recall_lost[t] <= max_lost for r in reports)]
    if not fitting:
        return None
    return min(fitting, key=lambda t: (max(r.false_accept[t] for r in reports), t))


def format_abstain(reports: Sequence[AbstainReport], configured: float) -> str:
    """One row per threshold: each set's false accepts and recall@5 lost; the pick marked."""
    picked = pick_threshold(reports)
    head = f"{'threshold':>9}  " + "  ".join(f"{r.name[:20]:>20} FA / lost" for r in reports)
    lines = ["abstention (expected servers hidden): false accepts / recall@5 lost, per set", head]
    thresholds = sorted({*reports[0].thresholds} if reports else set())
    for t in thresholds:
        mark = " <- picked" if t == picked else ""
        mark += " <- configured" if abs(t - configured) < 1e-9 else ""
        cells = "  ".join(f"{' ':>10}{r.false_accept[t]:>6.1%} / {r.recall_lost[t]:.3f}" for r in reports)
        lines.append(f"{t:>9.3f}  {cells}{mark}")
    for r in reports:
        if r.empty_requests and picked is not None:
            lines.append(
                f"{r.name}: requests with nothing expected answered at {picked:g}: {r.empty_accept[picked]:.1%}"
            )
    if picked is None:
        lines.append(f"no threshold loses at most {MAX_RECALL_LOST} recall@5 on every set")
    return "\n".join(lines)
