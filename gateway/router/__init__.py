"""The semantic router: ranks the catalog's tools for a request (BM25 + local embeddings).

- `base`: the shared types (`ToolRecord`, `SearchHit`, `Embedder`, `EmbeddingCache`);
- `documents`: the text each tool is indexed by;
- `bm25`: the lexical index; `embedder`: the embedding model; `cache`: vectors on disk;
- `index`: `Router`, the index and the ranking; `router_config`: how it ranks;
  `snapshot`: one immutable state of the index;
- `signals`: usage signals (what the records store tells the router); `learning`: the
  score adjustments learnt from them;
- `service`: the router as a running gateway uses it; `eval`: the evaluation harness;
  `replay`: `eval --replay`, learning measured on held-back queries.
"""

__all__: list[str] = []
