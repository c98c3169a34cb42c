"""The router learns from use: bounded, decaying score adjustments from usage signals.

A `UsageModel` holds the signals the records store reports (`gateway.router.signals`):
after the search `query`, `tool` was called and worked (+1) or failed (-1), or was rated.
For a new request it returns, per tool, an additive adjustment of the tool's 0..1 score:

    weight(signal)  = gate(cosine(request, signal query)) * 0.5 ** (age / half_life)
    gate(s)         = clip((s - min_similarity) / (1 - min_similarity), 0, 1)
    learnt(tool)    = sum(weight * value) / (half_weight_signals + sum(weight))     in -1..1
    adjustment      = learnt * (max_boost if learnt > 0 else max_penalty)
                    + prior(tool) * max_prior
    prior(tool)     = the same mean over the tool's query-less signals (weight = decay only)

and the sum is clipped to `[-max_penalty, max_boost]`. So only signals from *similar*
requests count (a thumbs-down given after an unrelated request changes nothing), one
signal moves a tool by at most `1 / (1 + half_weight_signals)` of the bound, agreeing
signals approach the bound but never pass it, and old signals fade.

Requests are compared by their vectors: the router's query embeddings, or, when the
router runs on BM25 alone, `lexical_vector` (hashed bags of the BM25 terms: cosine is
then the share of terms two requests have in common). Each distinct query is embedded
once, when its first signal arrives (`new_queries`, then `add`); old ones never again.
Signals are summed per (query, tool) pair when they are added, so a search costs one
product with the distinct queries' vectors and a pass over the pairs of similar ones.

Pure numpy, no I/O, no clock except the `now` a caller passes (default `time.time()`).
An update builds a new immutable state and swaps it in, so searches on other threads
read a consistent model while signals are added.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gateway.router.base import Matrix, Vector
from gateway.router.bm25 import tokenize
from gateway.router.signals import UsageSignal

__all__ = ["LEXICAL_DIM", "LearningConfig", "UsageModel", "lexical_vector"]

LEXICAL_DIM = 1024
"""Buckets of `lexical_vector`. Two distinct terms share one with probability 1/1024."""

_FORGOTTEN = 2.0**-10
"""Signals that have decayed below this weight (ten half-lives) are dropped."""


@dataclass(frozen=True)
class LearningConfig:
    """How much use may move a score. Defaults are the measured choice (`mcp-gateway eval --replay`:
    docs/benchmarks.md, "Routing quality")."""

    max_boost: float = 0.25
    """Most a tool's 0..1 score is raised by what was learnt."""
    max_penalty: float = 0.15
    """Most a tool's 0..1 score is lowered by what was learnt."""
    max_prior: float = 0.03
    """Most the query-less signals (tools called by name) move a tool, for every request."""
    half_life_days: float = 30.0
    """A signal's weight halves every this many days."""
    min_similarity: float = 0.3
    """Signals from requests less similar than this (cosine) are ignored."""
    half_weight_signals: float = 2.0
    """How many agreeing signals from an identical request move a tool half of the bound."""
    max_signals: int = 100_000
    """Most signals kept (the newest); each costs a few bytes plus its query's vector once."""

    def __post_init__(self) -> None:
        for name in ("max_boost", "max_penalty", "max_prior"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in 0..1")
        if self.half_life_days <= 0:
            raise ValueError("half_life_days must be positive")
        if not 0.0 <= self.min_similarity < 1.0:
            raise ValueError("min_similarity must be in 0..1 (1 excluded)")
        if self.half_weight_signals <= 0:
            raise ValueError("half_weight_signals must be positive")
        if self.max_signals < 1:
            raise ValueError("max_signals must be at least 1")


def lexical_vector(text: str, dim: int = LEXICAL_DIM) -> Vector:
    """A unit vector of `text`'s distinct BM25 terms, hashed into `dim` buckets (all zero if none)."""
    vector = np.zeros(dim, dtype=np.float32)
    terms = {zlib.crc32(term.encode()) % dim for term in tokenize(text)}
    if terms:
        vector[list(terms)] = 1.0
        vector /= np.float32(np.sqrt(len(terms)))
    return vector


@dataclass(frozen=True)
class _State:
    """The signals as arrays; `query_row` is -1 for a query-less signal."""

    queries: dict[str, int] = field(default_factory=dict)
    vectors: Matrix | None = None
    tools: tuple[str, ...] = ()
    tool_row: dict[str, int] = field(default_factory=dict)
    query_row: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    tool: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    value: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    at: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))


_Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class _Sums:
    """The signals summed per (query, tool) pair and, for query-less ones, per tool.

    Decay factors out: `0.5 ** ((now - at) / h) = 0.5 ** ((now - newest) / h) * 0.5 ** ((at - newest) / h)`,
    so each signal's weight relative to the newest one (`relative`, in 2**-10..1) is summed
    once, when signals are added, and a search multiplies by one common factor.
    """

    newest: float = 0.0
    pair_query: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    pair_tool: npt.NDArray[np.intp] = field(default_factory=lambda: np.zeros(0, dtype=np.intp))
    pair_value: _Array = field(default_factory=lambda: np.zeros(0))
    """Sum of relative weight * value per pair."""
    pair_weight: _Array = field(default_factory=lambda: np.zeros(0))
    """Sum of relative weight per pair."""
    prior_value: _Array = field(default_factory=lambda: np.zeros(0))
    prior_weight: _Array = field(default_factory=lambda: np.zeros(0))

    @classmethod
    def of(cls, state: _State, half_life_seconds: float) -> _Sums:
        if not len(state.at):
            return cls()
        n_tools = len(state.tools)
        newest = float(state.at.max())
        relative = np.exp2((state.at - newest) / half_life_seconds)
        tied = state.query_row >= 0
        pairs, inverse = np.unique(state.query_row[tied] * n_tools + state.tool[tied], return_inverse=True)
        untied_tool, untied = state.tool[~tied], relative[~tied]
        return cls(
            newest=newest,
            pair_query=(pairs // n_tools).astype(np.intp),
            pair_tool=(pairs % n_tools).astype(np.intp),
            pair_value=_sum(inverse, (relative * state.value)[tied], len(pairs)),
            pair_weight=_sum(inverse, relative[tied], len(pairs)),
            prior_value=_sum(untied_tool, untied * state.value[~tied], n_tools),
            prior_weight=_sum(untied_tool, untied, n_tools),
        )


class UsageModel:
    """What use taught about tools, as per-request score adjustments (see the module docstring)."""

    def __init__(self, config: LearningConfig | None = None) -> None:
        self.config = config or LearningConfig()
        self._current = (_State(), _Sums())
        """Replaced as a whole by `add`, so a search never sees a state with another state's sums."""
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._current[0].tool)

    @property
    def queries(self) -> int:
        """Distinct queries held (each embedded once)."""
        return len(self._current[0].queries)

    def new_queries(self, signals: Sequence[UsageSignal]) -> list[str]:
        """The distinct queries of `signals` that `add` will need a vector for, in first-seen order."""
        known = self._current[0].queries
        return list(dict.fromkeys(s.query for s in signals if s.query is not None and s.query not in known))

    def add(self, signals: Sequence[UsageSignal], vectors: Mapping[str, Vector], now: float | None = None) -> None:
        """Add `signals`; `vectors` holds a unit vector for each of `new_queries(signals)`.

        Signals that have faded below 1/1024 of their weight, and the oldest beyond
        `max_signals`, are dropped, with the queries no signal uses any more.
        """
        if not signals:
            return
        now = time.time() if now is None else now
        with self._lock:
            old = self._current[0]
            missing = [q for q in self.new_queries(signals) if q not in vectors]
            if missing:
                raise ValueError(f"no vector for the new query {missing[0]!r}")
            queries = dict(old.queries)
            added: list[Vector] = []
            for s in signals:
                if s.query is not None and s.query not in queries:
                    queries[s.query] = len(queries)
                    added.append(np.asarray(vectors[s.query], dtype=np.float32))
            all_vectors = _stack(old.vectors, added)
            tools = list(old.tools)
            tool_row = dict(old.tool_row)
            for s in signals:
                if s.tool not in tool_row:
                    tool_row[s.tool] = len(tools)
                    tools.append(s.tool)
            state = _State(
                queries=queries,
                vectors=all_vectors,
                tools=tuple(tools),
                tool_row=tool_row,
                query_row=np.concatenate(
                    [old.query_row, [-1 if s.query is None else queries[s.query] for s in signals]]
                ).astype(np.intp),
                tool=np.concatenate([old.tool, [tool_row[s.tool] for s in signals]]).astype(np.intp),
                value=np.concatenate([old.value, [float(np.clip(s.value, -1.0, 1.0)) for s in signals]]),
                at=np.concatenate([old.at, [s.at for s in signals]]),
            )
            state = _forget(state, self._decay(state.at, now), self.config.max_signals)
            sums = _Sums.of(state, self.config.half_life_days * 86_400.0)
            self._current = (state, sums)

    def adjustments(self, query_vector: Vector | None, now: float | None = None) -> dict[str, float]:
        """The score adjustment of each tool use says something about, for a request with this vector.

        `None` (a request that cannot be embedded) applies the query-less prior only.
        Tools absent from the result are not adjusted.
        """
        state, sums = self._current
        if not len(state.tool):
            return {}
        cfg = self.config
        now = time.time() if now is None else now
        common = float(self._decay(np.array([sums.newest]), now)[0])
        n_tools = len(state.tools)
        total = np.zeros(n_tools)
        if query_vector is not None and state.vectors is not None and len(sums.pair_query):
            similarity = np.einsum("qd,d->q", state.vectors, np.asarray(query_vector, dtype=np.float32))
            gate = np.clip((similarity - cfg.min_similarity) / (1.0 - cfg.min_similarity), 0.0, 1.0)
            weight = gate[sums.pair_query] * common
            near = np.flatnonzero(weight)
            tool = sums.pair_tool[near]
            evidence = _sum(tool, weight[near] * sums.pair_value[near], n_tools)
            mass = _sum(tool, weight[near] * sums.pair_weight[near], n_tools)
            learnt = evidence / (cfg.half_weight_signals + mass)
            total += np.where(learnt > 0, learnt * cfg.max_boost, learnt * cfg.max_penalty)
        if cfg.max_prior and len(sums.prior_value):
            prior = common * sums.prior_value / (cfg.half_weight_signals + common * sums.prior_weight)
            total += cfg.max_prior * prior
        total = np.clip(total, -cfg.max_penalty, cfg.max_boost)
        return {state.tools[i]: float(total[i]) for i in np.flatnonzero(np.abs(total) > 1e-9)}

    def _decay(self, at: npt.NDArray[np.float64], now: float) -> npt.NDArray[np.float64]:
        age_days = np.maximum(now - at, 0.0) / 86_400.0
        return np.asarray(np.exp2(-age_days / self.config.half_life_days))


def _sum(index: npt.NDArray[np.intp], weights: _Array, n: int) -> _Array:
    """`weights` summed by `index`, one sum for each of `n` slots."""
    return np.bincount(index, weights=weights, minlength=n).astype(np.float64, copy=False)


def _stack(old: Matrix | None, added: list[Vector]) -> Matrix | None:
    if not added:
        return old
    new = np.stack(added).astype(np.float32, copy=False)
    return new if old is None else np.concatenate([old, new])


def _forget(state: _State, decay: npt.NDArray[np.float64], max_signals: int) -> _State:
    """`state` without faded signals and the oldest beyond `max_signals`, and without unused queries."""
    keep = decay >= _FORGOTTEN
    if keep.sum() > max_signals:
        newest = np.argsort(-state.at, kind="stable")[:max_signals]
        keep = np.zeros_like(keep)
        keep[newest] = True
    if keep.all():
        return state
    query_row = state.query_row[keep]
    used = np.unique(query_row[query_row >= 0])
    renumber = np.full(len(state.queries) + 1, -1, dtype=np.intp)  # the last slot maps -1 to -1
    renumber[used] = np.arange(len(used))
    by_row = {row: query for query, row in state.queries.items()}
    return _State(
        queries={by_row[int(row)]: i for i, row in enumerate(used)},
        vectors=None if state.vectors is None or not len(used) else state.vectors[used],
        tools=state.tools,
        tool_row=state.tool_row,
        query_row=renumber[query_row],
        tool=state.tool[keep],
        value=state.value[keep],
        at=state.at[keep],
    )
