"""How the router ranks (`RouterConfig`): the measured default and the alternatives `eval` compares.

Apart from the index (`gateway.router.index`) because it is plain data: the evaluation harness,
`eval --replay` and the benchmarks choose a configuration without the index's machinery, and the
index reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Fusion", "RouterConfig"]

Fusion = Literal["weighted", "rrf", "dense", "bm25"]


@dataclass(frozen=True)
class RouterConfig:
    """How `Router.search` ranks. The defaults are the measured choice: `bench/router_variants.py` ranks
    every alternative below on both dev sets (docs/benchmarks.md, "Routing quality")."""

    fusion: Fusion = "weighted"
    """weighted: `dense_weight` * cosine + (1 - `dense_weight`) * BM25 coverage;
    rrf: reciprocal rank fusion of the two rankings; dense / bm25: one signal alone.
    Without an embedder every variant is BM25 alone."""
    dense_weight: float = 0.5
    rrf_k: int = 60
    server_weight: float = 0.0
    """> 0: add this weight times the score of the tool's server (its name, description
    and tool names, scored like a tool) to each tool's score. Off by default: it did not
    help on LiveMCPBench."""
    split: Literal["off", "sentences", "clauses"] = "sentences"
    """Rank a long request's steps (its sentences, see `split_query`) each on its own too,
    and merge the rankings, so that its later steps are not lost: on long requests made of
    3-5 MetaTool requests recall@10 went from 0.545 to 0.738 (plain BM25: 0.618), with
    MetaTool unchanged and LiveMCPBench recall@10 0.559 -> 0.551 (`bench/router_variants.py --long`).
    Each step costs a query embedding. Clauses (split at "and", "then", commas) lost 0.10
    recall@10 on long requests."""
    merge: Literal["round_robin", "max", "mean", "share"] = "round_robin"
    """With `split`: take turns between the rankings (the full request's first); a tool's
    best score; the mean of the full request's score and the best step score; or each
    step's share of the top k, more where a step is unsure (`fusion.share`: +0.013
    recall@10 on long requests, but -0.033 recall@1 there and -0.019 on LiveMCPBench)."""
    split_min_steps: int = 3
    """With `split`: a request is ranked step by step only when it has at least this many
    steps; shorter ones (a question and its context: most single-tool requests) are ranked
    whole. 2 cost LiveMCPBench 0.02 recall@5 (and MetaTool 0.044 recall@1 with `share`)."""
    full_document_weight: float = 0.5
    """A tool's vector is `(1 - w) * v(short text) + w * v(full text)`, so its cosine is the
    weighted mean of the two texts' cosines. The full text is its `tool_document`
    (parameters, server description) cut at `full_document_tokens` word pieces, embedded
    by `Router.enrich` after `update` (about 3.5 times the work of the short texts).
    Measured on LiveMCPBench: +0.03 recall@5 and recall@10 on both halves of the queries
    (`bench/router_variants.py`, variant `short-text`). 0: the short text alone, and `enrich` does nothing."""
    full_document_tokens: int = 128
    """Where the full text is cut, in word pieces: the whole document (up to the model's
    limit) cost twice as much to embed and ranked the same (`bench/router_variants.py`, variant `full-uncut`)."""
    query_text: Literal["compact", "raw"] = "compact"
    """What the embedding model reads of a request: `compact_query(request)` (paths and URLs
    as their kind, no stopwords: recall within noise, 40% fewer word pieces, hence faster),
    or the request as is. BM25 always reads the request as is."""
    k1: float = 1.2
    b: float = 0.75

    def describe(self, dense: bool) -> str:
        """A short name of the configuration, e.g. `weighted(dense=0.5,bm25=0.5)`."""
        if not dense or self.fusion == "bm25":
            parts = ["bm25"]
        elif self.fusion == "weighted":
            parts = [f"weighted(dense={self.dense_weight:g},bm25={1 - self.dense_weight:g})"]
        elif self.fusion == "rrf":
            parts = [f"rrf(k={self.rrf_k})"]
        else:
            parts = ["dense"]
        if dense and self.fusion != "bm25" and self.full_document_weight:
            parts.append(f"full-document={self.full_document_weight:g}/{self.full_document_tokens}")
        if self.server_weight:
            parts.append(f"server={self.server_weight:g}")
        if self.split != "off":
            parts.append(f"split={self.split}/{self.merge}")
        if dense and self.fusion != "bm25" and self.query_text == "raw":
            parts.append("raw-query")
        return "+".join(parts)
