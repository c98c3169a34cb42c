"""A small Okapi BM25 index in numpy, with a tokenizer for identifiers and CJK text.

The index is rebuilt from per-document term counts, which are kept between updates,
so an update tokenizes only new or changed documents; building the postings of
10,000 tool documents takes a fraction of a second. Search is exact: a dense score
array is accumulated from each query term's postings.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["BM25Index", "STOPWORDS", "tokenize"]

# Runs of letters/digits (Latin and other alphabets) or runs of CJK characters.
_CJK = (
    "\u3040-\u30ff"  # hiragana, katakana
    "\u3400-\u4dbf"  # CJK extension A
    "\u4e00-\u9fff"  # CJK unified ideographs
    "\uac00-\ud7af"  # hangul syllables
    "\uf900-\ufaff"  # CJK compatibility ideographs
)
_TOKEN = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RUN = re.compile(rf"^[{_CJK}]+$")
_CAMEL_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_DIGIT_BOUNDARY = re.compile(r"(?<=[^\W\d_])(?=\d)|(?<=\d)(?=[^\W\d_])")

# English function words and the filler of requests ("please help me ..."): general,
# not tied to any tool set.
STOPWORDS = frozenset(
    """
    a about above after again all also am an and any are as at be been before being below
    between both but by can could did do does doing done down during each either else etc
    for from further had has have having he her here hers him his how i if in into is it its
    itself just let me more most my myself no nor not now of off on once only or other our
    ours out over own please same she should so some such than that the their theirs them
    then there these they this those through to too under until up us very via was we were
    what when where which while who whom why will with within would you your yours
    """.split()
)


def _stem(word: str) -> str:
    """A light English suffix stripper: plurals, -ing, -ed, a final -e; short words stay as they are."""
    if len(word) <= 3 or not word.isascii() or not word.isalpha():
        return word
    for suffix, replacement, min_stem in (
        ("ies", "y", 3),
        ("sses", "ss", 3),
        ("ing", "", 4),
        ("ed", "", 4),
        ("es", "", 4),
        ("s", "", 3),
    ):
        if word.endswith(suffix) and len(word) - len(suffix) >= min_stem:
            if suffix == "s" and word.endswith(("ss", "us", "is")):
                return word
            if suffix == "es" and not word.endswith(("ches", "shes", "xes", "zes", "sses")):
                continue
            word = word[: len(word) - len(suffix)] + replacement
            # "running" -> "runn" -> "run"
            if suffix in ("ing", "ed") and len(word) >= 4 and word[-1] == word[-2] and word[-1] not in "lsz":
                word = word[:-1]
            break
    # "create", "created", "creating" -> "creat"
    if len(word) >= 4 and word.endswith("e"):
        word = word[:-1]
    return word


def tokenize(text: str, *, stopwords: frozenset[str] = STOPWORDS, stem: bool = True) -> list[str]:
    """Terms of `text` for BM25.

    Identifiers are split (`searchIssues`, `search_issues`, `search-issues` all give
    `search`, `issue`), everything is lowercased, English stopwords are dropped and a
    light stemmer folds plurals and -ing/-ed forms. Runs of CJK characters, which are
    written without spaces, become overlapping character bigrams (a lone character
    stays a unigram).
    """
    terms: list[str] = []
    for match in _TOKEN.finditer(text):
        token = match.group()
        if _CJK_RUN.match(token):
            if len(token) == 1:
                terms.append(token)
            else:
                terms.extend(token[i : i + 2] for i in range(len(token) - 1))
            continue
        for part in _CAMEL_BOUNDARY.split(token):
            for word in _DIGIT_BOUNDARY.split(part):
                word = word.lower()
                if not word or word in stopwords:
                    continue
                terms.append(_stem(word) if stem else word)
    return terms


@dataclass
class _Postings:
    docs: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float32]
    """idf * the tf/length part of BM25, per document containing the term."""
    idf: float


class BM25Index:
    """Okapi BM25 over a list of documents, addressed by key, in a fixed row order.

    `update` makes the index hold exactly the given (key, text) pairs, in that order;
    `scores` returns one score per row. Term counts of documents whose text did not
    change are reused, so an update costs a tokenization of the changed documents plus
    a rebuild of the postings.
    """

    def __init__(self, k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = k1
        self.b = b
        self._keys: list[Hashable] = []
        self._counts: dict[Hashable, tuple[str, Counter[str]]] = {}
        self._postings: dict[str, _Postings] = {}
        self.tokenized = 0
        """Documents tokenized by the last update (the others were reused)."""

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def keys(self) -> list[Hashable]:
        return list(self._keys)

    @classmethod
    def build(
        cls,
        documents: Sequence[tuple[Hashable, str]],
        *,
        k1: float = 1.2,
        b: float = 0.75,
        previous: BM25Index | None = None,
    ) -> BM25Index:
        """A new index of `documents`, reusing the term counts of `previous` where the
        text is unchanged. `previous` itself is left as it was (searches may still use it)."""
        index = cls(k1, b)
        if previous is not None:
            index._counts = previous._counts
        index.update(documents)
        return index

    def update(self, documents: Sequence[tuple[Hashable, str]]) -> int:
        """Hold exactly `documents`, in this order. Returns how many were (re)tokenized."""
        counts: dict[Hashable, tuple[str, Counter[str]]] = {}
        tokenized = 0
        for key, text in documents:
            if key in counts:
                raise ValueError(f"duplicate document key {key!r}")
            old = self._counts.get(key)
            if old is not None and old[0] == text:
                counts[key] = old
            else:
                counts[key] = (text, Counter(tokenize(text)))
                tokenized += 1
        self._keys = [key for key, _ in documents]
        self._counts = counts
        self.tokenized = tokenized
        self._rebuild()
        return tokenized

    def _rebuild(self) -> None:
        n = len(self._keys)
        lengths = np.array([sum(self._counts[key][1].values()) for key in self._keys], dtype=np.float32)
        avgdl = float(lengths.mean()) if n and lengths.sum() > 0 else 1.0
        norm = self.k1 * (1.0 - self.b + self.b * lengths / avgdl)
        rows: dict[str, list[int]] = {}
        tfs: dict[str, list[int]] = {}
        for row, key in enumerate(self._keys):
            for term, count in self._counts[key][1].items():
                rows.setdefault(term, []).append(row)
                tfs.setdefault(term, []).append(count)
        postings: dict[str, _Postings] = {}
        for term, term_rows in rows.items():
            docs = np.asarray(term_rows, dtype=np.int32)
            tf = np.asarray(tfs[term], dtype=np.float32)
            df = len(term_rows)
            # Lucene's idf: always positive, so common terms still count a little.
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            weights = (idf * tf * (self.k1 + 1.0) / (tf + norm[docs])).astype(np.float32)
            postings[term] = _Postings(docs, weights, idf)
        self._postings = postings

    def query_terms(self, query: str) -> list[str]:
        """The distinct indexed terms of `query`, in order of first appearance."""
        return [t for t in dict.fromkeys(tokenize(query)) if t in self._postings]

    def scores(self, query: str) -> npt.NDArray[np.float32]:
        """BM25 score of every row (0 for rows sharing no term with the query)."""
        out = np.zeros(len(self._keys), dtype=np.float32)
        for term in self.query_terms(query):
            p = self._postings[term]
            out[p.docs] += p.weights
        return out

    def max_score(self, query: str) -> float:
        """An upper bound of `scores(query)`: every query term at its best tf/length.

        Dividing by it maps scores to 0..1 as "how much of the query a document covers".
        """
        return sum(self._postings[t].idf for t in self.query_terms(query)) * (self.k1 + 1.0)
