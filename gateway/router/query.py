"""The text of a request that the embedding model reads.

Requests to a tool router are often long task descriptions: "Please perform a
comprehensive analysis of the audio file located at /root/music/mixkit-retro-game-
emergency-alarm-1000.wav ...". For choosing a tool, a path says "a file of this kind",
not which one; its word pieces (a dozen for that path) cost embedding time, which grows
with the query's length, and pull the query's vector towards nothing in particular. The
same goes for the function words and filler of a request ("please", "I'd like you to",
"the", "of"): a sentence embedding of the content words alone ranks as well and is much
shorter.

`compact_query` therefore rewrites paths, URLs and e-mail addresses as their kind ("file
wav", "folder", "URL", "email address") and drops English stopwords (the BM25 index's
list). It is applied to the embedded text only: BM25 reads the request as written, where
the words of a path may still match a tool.

Measured on LiveMCPBench (`bench/router_variants.py`, variant `raw-query` against `default`): median
query length 31 -> 19 word pieces, with recall equal or better. Pure functions: no model, no I/O.
"""

from __future__ import annotations

import re

from gateway.router.bm25 import STOPWORDS

__all__ = ["compact_query", "cut_query"]

_URL = re.compile(r"\b(?:https?|ftp|file|s3|gs)://[^\s<>\"']+|\bwww\.[^\s<>\"']+", re.IGNORECASE)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")
_PATH = re.compile(
    r"(?<![\w/])"  # not in the middle of a word ("and/or" is not a path)
    r"(?:[A-Za-z]:[\\/]|~/|\.{1,2}/|/)"  # C:\, ~/, ./, ../, /
    r"(?:[^\s\\/,;:'\"()<>]+[\\/]?)+"  # segments
)
_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?])")
_TRAILING = ".,;:!?)"
_EXTENSION = re.compile(r"\.([A-Za-z][A-Za-z0-9]{0,7})$")

_FILLER = frozenset({"kindly", "i'm", "i'd", "i'll", "i've", "let's", "can't", "don't", "it's", "that's"})
"""Contractions and request filler, beside `STOPWORDS`."""


def cut_query(text: str, limit: int) -> str:
    """`text` stripped and within `limit` characters, cut at the last space before it when there is one,
    so a request's cost is bounded before anything reads it (`routing.max_query_chars`)."""
    text = text.strip() if len(text) <= limit * 2 else text[: limit * 2].strip()
    if len(text) <= limit:
        return text
    head = text[:limit]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip()


def _split_trailing(text: str) -> tuple[str, str]:
    """`text` without the sentence punctuation that follows it, and that punctuation."""
    core = text.rstrip(_TRAILING)
    return core, text[len(core) :]


def _url_kind(match: re.Match[str]) -> str:
    _, tail = _split_trailing(match.group())
    return "URL" + tail


def _path_kind(match: re.Match[str]) -> str:
    """`/root/pdf/report.pdf` -> `file pdf`; `/root/pdf` or `/tmp/out/` -> `folder`."""
    path, tail = _split_trailing(match.group())
    if len(path) <= 1:  # a lone "/" or "~/"
        return match.group()
    last = re.split(r"[\\/]", path.rstrip("\\/"))[-1]
    extension = _EXTENSION.search(last) if not path.endswith(("/", "\\")) else None
    kind = f"file {extension.group(1).lower()}" if extension else "folder"
    return kind + tail


def _drop_stopword(match: re.Match[str]) -> str:
    word = match.group().lower()
    return "" if word in STOPWORDS or word in _FILLER else match.group()


def compact_query(query: str) -> str:
    """`query` as the embedding model should read it: paths, URLs and e-mail addresses as
    their kind, without stopwords and filler, whitespace collapsed.

    Returns `query` stripped if nothing would be left (a request made of stopwords only).
    """
    text = _URL.sub(_url_kind, query)
    text = _EMAIL.sub("email address", text)
    text = _PATH.sub(_path_kind, text)
    text = _WORD.sub(_drop_stopword, text)
    text = _SPACE_BEFORE_PUNCTUATION.sub(r"\1", _SPACES.sub(" ", text)).strip(" ,;:")
    if not _WORD.search(text) and not re.search(r"\w", text):
        return query.strip()
    return text
