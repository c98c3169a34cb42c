"""The steps of a multi-step request, for ranking each step on its own (`RouterConfig.split`).

By default a request of three sentences or more is split into sentences (`RouterConfig.split`,
`split_min_steps`): on long requests of 3-5 MetaTool requests that lifts recall@10 by about 0.19, and
on LiveMCPBench's tasks it moves recall within noise (`bench/router_variants.py --long`, variant
`steps-off`). Splitting at clauses too lost 0.10 recall@10 on long requests. Pure: no I/O.
"""

from __future__ import annotations

import re

from gateway.router.bm25 import tokenize

__all__ = ["MAX_SUBQUERIES", "MIN_SUBQUERY_WORDS", "split_query"]

_SENTENCE_SPLIT = re.compile(
    r"(?<=[.!?;])(?<!\b[A-Z][a-z]\.)(?<!\b[A-Z]\.)\s+"  # sentence ends, but not after "Mr." or "J."
    r"|(?<=[。！？；])"
    r"|\n+"
    r"|(?:^|\s)\(?\d{1,2}[.)]\s+"  # numbered steps: "1. ", "2) ", "(3) "
)
_CLAUSE_SPLIT = re.compile(
    r",\s+(?:and\s+then\s+|and\s+|then\s+)?"
    r"|\s+(?:and\s+then|then|and\s+also|also|after\s+that|finally)\s+"
    r"|\s+and\s+(?=\w+\s+\w+)"
    r"|[，、]",
    re.IGNORECASE,
)
MIN_SUBQUERY_WORDS = 3
MIN_STEP_CONTENT_WORDS = 2
"""A sentence with fewer content words (not stopwords) than this is not a step of its own
but part of the one before ("Can you help me with that?" after a request)."""
MAX_SUBQUERIES = 6


def _content_words(text: str) -> int:
    return len(tokenize(text, stem=False))


def split_query(query: str, *, clauses: bool = True) -> list[str]:
    """The steps of a multi-step request: sentences, numbered steps, and (with `clauses`)
    clauses joined by commas, "and", "then".

    Parts shorter than `MIN_SUBQUERY_WORDS` words are merged into their neighbour; at
    most `MAX_SUBQUERIES` are returned (the rest joined into the last one). A
    single-step request gives `[query]`.
    """
    pieces = [p for p in _SENTENCE_SPLIT.split(query.strip()) if p and p.strip()]
    if clauses:
        pieces = [c for p in pieces for c in _CLAUSE_SPLIT.split(p) if c and c.strip()]
    parts: list[str] = []
    for piece in (p.strip(" ,;") for p in pieces):
        if not piece:
            continue
        if parts and (len(parts[-1].split()) < MIN_SUBQUERY_WORDS or _content_words(piece) < MIN_STEP_CONTENT_WORDS):
            parts[-1] = f"{parts[-1]} {piece}"
        else:
            parts.append(piece)
    if len(parts) > 1 and len(parts[-1].split()) < MIN_SUBQUERY_WORDS:
        tail = parts.pop()
        parts[-1] = f"{parts[-1]} {tail}"
    if len(parts) > MAX_SUBQUERIES:
        parts = parts[: MAX_SUBQUERIES - 1] + [" ".join(parts[MAX_SUBQUERIES - 1 :])]
    return parts or [query.strip()]
