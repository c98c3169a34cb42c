"""How the router turns its two signals into one ranking: pure numpy functions on score rows.

`coverage` maps BM25 scores to 0..1, `dot` is the cosine product (without BLAS, see there),
`rrf` is reciprocal rank fusion (a measured variant), `top` the k best rows in a stable
order, `round_robin` the merge of a long request's step rankings, `share` a measured
alternative to it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from gateway.router.base import Matrix
from gateway.router.bm25 import BM25Index

__all__ = ["coverage", "dot", "round_robin", "rrf", "share", "top"]


def dot(queries: Matrix, matrix: Matrix) -> npt.NDArray[np.float32]:
    """`queries @ matrix.T`, computed without BLAS.

    numpy's BLAS (OpenBLAS) runs a large product on a pool of threads that keep spinning
    for a while after it returns; on a 2-core machine they then compete with the ONNX
    Runtime threads of the next query embedding, which measured 2x slower (12.8 ms instead
    of 5.6 ms) right after a 10,000 x 384 product. einsum's own loop is single-threaded
    and takes about 1 ms for 10,000 tools.
    """
    return np.einsum("qd,nd->qn", queries, matrix, optimize=False)


def coverage(index: BM25Index, query: str) -> npt.NDArray[np.float32]:
    """BM25 scores divided by the best score any document could get for `query` (0..1)."""
    top = index.max_score(query)
    if top <= 0:
        return np.zeros(len(index), dtype=np.float32)
    return index.scores(query) / np.float32(top)


def rrf(k: int, *rankings: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Reciprocal rank fusion of score rows, scaled so that first everywhere scores 1.

    A tool scoring 0 in a ranking (no term in common, or a non-positive cosine) gets
    nothing from it, rather than the contribution of its arbitrary rank among the zeros.
    """
    out = np.zeros_like(rankings[0])
    rows = np.arange(rankings[0].shape[0])[:, None]
    for scores in rankings:
        order = np.argsort(-scores, axis=1, kind="stable")
        ranks = np.empty_like(order)
        ranks[rows, order] = np.arange(scores.shape[1])[None, :]
        contribution = 1.0 / (k + 1 + ranks)
        contribution[scores <= 0] = 0.0
        out += contribution
    return np.asarray(out * (k + 1) / len(rankings), dtype=np.float32)


def top(scores: npt.NDArray[np.float32], k: int) -> npt.NDArray[np.intp]:
    """Rows of the k best scores, best first, equal scores by row (rows are in name order)."""
    if k < len(scores):
        cut = np.partition(-scores, k - 1)[k - 1]
        candidates = np.flatnonzero(-scores <= cut)
    else:
        candidates = np.arange(len(scores))
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order][:k]


def round_robin(scores: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
    """Merge the full request's ranking (row 0) with its steps' rankings, taking turns, so
    that every step gets a slot.

    The merged order is kept (so the first k of a longer list are the list for k); a
    tool's score is its best score, capped by the score of the tool before it so that
    scores never increase down the list.
    """
    best = scores.max(axis=0)
    rankings = [list(top(row, k)) for row in scores]
    picked: dict[int, None] = {}
    depth = 0
    while len(picked) < k and depth < k:
        for ranking in rankings:
            if depth < len(ranking) and len(picked) < k:
                picked.setdefault(int(ranking[depth]), None)
        depth += 1
    out: list[tuple[int, float]] = []
    ceiling = 1.0
    for i in picked:
        ceiling = min(ceiling, float(best[i]))
        out.append((i, ceiling))
    return out


def share(scores: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
    """Merge the rankings of a request's steps (one row each) so that every step gets its
    share of the first k, more of it where the step is unsure.

    Each step's scores are divided by its best score, so every step's best tool comes
    first (1.0); after them, a tool's place is its best ratio over the steps: a step
    whose runners-up score close to its best (several tools could fit) gets more of the
    k slots than one whose best tool stands out. A tool's score is its best raw score,
    capped by the score of the tool before it so that scores never increase down the list.
    """
    best_raw = scores.max(axis=0)
    tops = scores.max(axis=1, keepdims=True)
    ratios = np.where(tops > 0, scores / np.where(tops > 0, tops, 1.0), 0.0).max(axis=0)
    out: list[tuple[int, float]] = []
    ceiling = 1.0
    for i in top(np.asarray(ratios, dtype=np.float32), k):
        ceiling = min(ceiling, float(best_raw[i]))
        out.append((int(i), ceiling))
    return out
