"""Why a tool ranks where it does: the parts of its score, for the console's search playground.

`explain` reads the same index snapshot and the same functions `Router.search` ranks with
(`fusion.coverage` for BM25, `fusion.dot` for the cosine, `UsageModel.adjustments` for what
was learnt), for the whole request only: the total shown beside the parts is the one
`Router.search` returned, which also folds in long-request steps and the server's
description (`RouterConfig.server_weight`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gateway.router import fusion
from gateway.router.index import Router
from gateway.router.learning import lexical_vector

__all__ = ["ScoreParts", "explain"]


@dataclass(frozen=True, slots=True)
class ScoreParts:
    lexical: float
    """BM25 coverage of the request by the tool's text, 0..1."""
    dense: float | None
    """Cosine of the request and the tool's vector, 0..1; None when the router ranks with BM25 alone."""
    learned: float
    """What use taught the router for this request (added to the score; 0 without learning)."""


def explain(router: Router, query: str, names: Sequence[str]) -> dict[str, ScoreParts]:
    """The score parts of the named tools for `query` (synchronous: the model may run; use a worker
    thread). Names the index does not hold are left out."""
    snap = router._snapshot  # one immutable state, as `search` reads it
    rows = {name: snap.row_of[name] for name in names if name in snap.row_of}
    if not rows or not query.strip():
        return {}
    query = query.strip()
    lexical = fusion.coverage(snap.bm25, query)
    vector = None
    dense = None
    if router._uses_dense(snap):
        assert snap.matrix is not None
        vector = router._embed_queries([router._embedded_text(query)])
        dense = np.clip(fusion.dot(vector, snap.matrix), 0.0, 1.0)[0]
    learnt: dict[str, float] = {}
    if router.usage is not None and len(router.usage):
        learnt = router.usage.adjustments(vector[0] if vector is not None else lexical_vector(query))
    return {
        name: ScoreParts(
            lexical=round(float(lexical[row]), 4),
            dense=round(float(dense[row]), 4) if dense is not None else None,
            learned=round(float(learnt.get(name, 0.0)), 4),
        )
        for name, row in rows.items()
    }
