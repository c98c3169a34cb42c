"""`mcp-gateway eval --replay`: does learning from use improve the ranking of requests never seen?

The queries that have expected tools are split at random (seeded) into a training part
(`train_fraction`) and a held-back part. One router indexes the catalog; for each split:

1. training, in the split's order, online: each training request is searched with what
   was learnt so far, and a simulated user reacts to the first `shown` results:
   - for each expected set, the user calls the set's alternative ranked highest among the
     shown results, or the set's first alternative when none is shown (found some other
     way); the call succeeds (a `call` signal, +1) and the user gives it a thumbs-up (a
     `feedback` signal, +1); both signals carry the request as their query;
   - the user gives a thumbs-down (a `feedback` signal, -1) to the highest shown result
     that is in no expected set, if there is one;
   the signals are learnt (`Router.learn`) before the next request;
2. evaluation: each held-back request is searched twice by the same router, without and
   with what was learnt, and recall@k and MRR are computed as `mcp-gateway eval` does.

Held-back requests never reach the model: they are searched, never learnt from. What was
learnt is forgotten between splits. Splits are averaged over `repeats` seeds because one
split of ~50 queries is noisy; the spread of the lift is reported with the mean.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from gateway.router.base import Embedder, EmbeddingCache, SearchHit, ToolRecord
from gateway.router.eval import MRR_DEPTH, EvalQuery, score_ranking
from gateway.router.index import Router
from gateway.router.learning import LearningConfig
from gateway.router.router_config import RouterConfig
from gateway.router.signals import UsageSignal

__all__ = ["ReplayReport", "ReplaySplit", "format_replay", "run_replay", "simulate_feedback", "split_queries"]

SHOWN = 5
"""Results the simulated user looks at."""


def split_queries(
    queries: Sequence[EvalQuery], train_fraction: float, seed: int
) -> tuple[list[EvalQuery], list[EvalQuery]]:
    """A seeded random split of the queries with expected tools: (training, held back), both non-empty."""
    usable = [q for q in queries if q.expected]
    if len(usable) < 2:
        raise ValueError("a replay needs at least two queries with expected tools")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError("the training fraction must be between 0 and 1 (both excluded)")
    order = list(range(len(usable)))
    random.Random(seed).shuffle(order)
    n_train = min(max(round(len(usable) * train_fraction), 1), len(usable) - 1)
    return [usable[i] for i in order[:n_train]], [usable[i] for i in order[n_train:]]


def simulate_feedback(query: EvalQuery, hits: Sequence[SearchHit], at: float) -> list[UsageSignal]:
    """What the simulated user of the module docstring does after seeing `hits` for `query`."""
    shown = [h.name for h in hits]
    signals: list[UsageSignal] = []
    for alternatives in query.expected:
        called = next((name for name in shown if name in alternatives), None) or min(alternatives)
        signals.append(UsageSignal(query=query.query, tool=called, value=1.0, at=at, kind="call"))
        signals.append(UsageSignal(query=query.query, tool=called, value=1.0, at=at, kind="feedback"))
    relevant = set().union(*query.expected)
    wrong = next((name for name in shown if name not in relevant), None)
    if wrong is not None:
        signals.append(UsageSignal(query=query.query, tool=wrong, value=-1.0, at=at, kind="feedback"))
    return signals


@dataclass(frozen=True)
class ReplaySplit:
    """One split's figures on its held-back queries: without and with what training taught."""

    seed: int
    trained: int
    held_out: int
    signals: int
    without: dict[str, float]
    learned: dict[str, float]

    def lift(self, metric: str) -> float:
        return self.learned[metric] - self.without[metric]


@dataclass
class ReplayReport:
    ks: tuple[int, ...]
    train_fraction: float
    learning: LearningConfig
    splits: list[ReplaySplit] = field(default_factory=list)

    @property
    def metrics(self) -> list[str]:
        return [f"recall@{k}" for k in self.ks] + ["mrr"]

    def mean(self, which: str, metric: str) -> float:
        """The mean over splits of `without` or `learned` figures."""
        return statistics.fmean(getattr(s, which)[metric] for s in self.splits)

    def lift_spread(self, metric: str) -> dict[str, float]:
        lifts = [s.lift(metric) for s in self.splits]
        return {
            "mean": statistics.fmean(lifts),
            "std": statistics.pstdev(lifts),
            "min": min(lifts),
            "max": max(lifts),
        }

    def to_json(self) -> dict[str, Any]:
        metrics = self.metrics
        return {
            "train_fraction": self.train_fraction,
            "seeds": [s.seed for s in self.splits],
            "held_out_queries": self.splits[0].held_out if self.splits else 0,
            "shown": SHOWN,
            "without": {m: round(self.mean("without", m), 4) for m in metrics},
            "with": {m: round(self.mean("learned", m), 4) for m in metrics},
            "lift": {m: {key: round(v, 4) for key, v in self.lift_spread(m).items()} for m in metrics},
            "learning": asdict(self.learning),
        }


def run_replay(
    records: Sequence[ToolRecord],
    queries: Sequence[EvalQuery],
    ks: Sequence[int],
    embedder: Embedder | None,
    *,
    learning: LearningConfig | None = None,
    train_fraction: float = 0.5,
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    threshold: float = 0.0,
    config: RouterConfig | None = None,
    cache: EmbeddingCache | None = None,
) -> ReplayReport:
    """Train on simulated feedback, measure on held-back queries, for each seed (module docstring)."""
    ks = tuple(sorted({int(k) for k in ks}))
    if not ks or ks[0] < 1:
        raise ValueError("ks must be positive integers")
    if not seeds:
        raise ValueError("a replay needs at least one seed")
    learning = learning or LearningConfig()
    router = Router(embedder, cache=cache, config=config, learning=learning)
    router.update(records)
    router.enrich()
    depth = max(max(ks), MRR_DEPTH)
    report = ReplayReport(ks=ks, train_fraction=train_fraction, learning=learning)
    for seed in seeds:
        train, held_out = split_queries(queries, train_fraction, seed)
        router.forget()
        signals = 0
        for q in train:
            feedback = simulate_feedback(q, router.search(q.query, k=SHOWN, threshold=threshold), time.time())
            router.learn(feedback)
            signals += len(feedback)
        sums = {learned: dict.fromkeys(report.metrics, 0.0) for learned in (False, True)}
        for q in held_out:
            for learned in (False, True):
                ranked = [h.name for h in router.search(q.query, k=depth, threshold=threshold, learned=learned)]
                recall, rr = score_ranking(ranked, q.expected, ks)
                for k in ks:
                    sums[learned][f"recall@{k}"] += recall[k]
                sums[learned]["mrr"] += rr
        n = len(held_out)
        report.splits.append(
            ReplaySplit(
                seed=seed,
                trained=len(train),
                held_out=n,
                signals=signals,
                without={m: v / n for m, v in sums[False].items()},
                learned={m: v / n for m, v in sums[True].items()},
            )
        )
    return report


def format_replay(report: ReplayReport) -> str:
    """A few human-readable lines: the held-back figures without and with learning, and the lift."""
    first = report.splits[0]
    lines = [
        f"replay: {len(report.splits)} splits (seeds {', '.join(str(s.seed) for s in report.splits)}),"
        f" {first.trained} training / {first.held_out} held-back queries each,"
        f" ~{statistics.fmean(s.signals for s in report.splits):.0f} signals learnt per split",
    ]
    for metric in report.metrics:
        spread = report.lift_spread(metric)
        lines.append(
            f"  held-back {metric}: {report.mean('without', metric):.3f} without learning,"
            f" {report.mean('learned', metric):.3f} with; lift {spread['mean']:+.3f}"
            f" (std {spread['std']:.3f}, min {spread['min']:+.3f}, max {spread['max']:+.3f})"
        )
    return "\n".join(lines)
