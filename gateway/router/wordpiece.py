"""The bundled model's word pieces in Python, for texts of characters whose handling is checked;
any other text goes to the Rust tokenizer (`tokenizers`), loaded then.

Why: the Rust tokenizer costs an idle gateway about 13 MB (its library's pages, its import, and
the vocabulary it builds from `tokenizer.json`); this one holds the vocabulary as one dict
(about 4 MB). The ids are the Rust tokenizer's: the BERT pipeline of the bundled model
(`BertNormalizer`: control characters dropped, whitespace made a space, accents stripped,
lower case; `BertPreTokenizer`: split at whitespace, each punctuation character alone;
`WordPiece` with `##` and `[UNK]`; `[CLS] ... [SEP]`; at most 512 ids) is simple for the
characters of `checked_characters()` (Latin, Greek, punctuation, symbols, emoji), and
tests/test_router_wordpiece.py checks every one of them, alone and in texts, against the Rust
tokenizer. A text with any other character (whose Unicode tables the two might read differently),
or with a special token's text (`[CLS]`...), is tokenized by the Rust tokenizer itself, so the
ids never differ: the Rust tokenizer is then loaded (once) and kept.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

__all__ = ["Encoding", "WordPieceTokenizer", "checked_characters", "normalized_char", "tables"]

_RANGES = ((0x0000, 0x024F), (0x0370, 0x03FF), (0x2000, 0x27BF), (0x1F300, 0x1FAFF))
"""Latin (Basic, Latin-1, Extended-A and -B), Greek, punctuation and symbols (arrows, maths,
shapes, dingbats), emoji."""


def checked_characters() -> frozenset[str]:
    """The characters tokenized here, each checked against the Rust tokenizer (tests/test_router_wordpiece.py);
    a text with any other goes to `tokenizers`. Unassigned code points are not: Python's tables drop
    them, the Rust tokenizer's keep them. (Made when asked: only the tables made of them are kept.)"""
    return frozenset(chr(c) for a, b in _RANGES for c in range(a, b + 1) if unicodedata.category(chr(c)) != "Cn")


def _char_class(chars: frozenset[str]) -> str:
    """A regular expression's character class body of `chars`, as runs of code points."""
    runs: list[list[int]] = []
    for c in sorted(map(ord, chars)):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return "".join(re.escape(chr(a)) + (f"-{re.escape(chr(b))}" if b > a else "") for a, b in runs)


_WHITESPACE = frozenset("\t\n\r\x0b\x0c \x85\xa0\u1680\u2028\u2029\u202f\u205f\u3000") | frozenset(
    chr(c) for c in range(0x2000, 0x200B)
)
"""Rust's `char::is_whitespace` (Unicode's White_Space), which the normalizer and the pre-tokenizer use."""


def _is_punctuation(c: str) -> bool:
    """`BertPreTokenizer`'s punctuation: ASCII punctuation, or a Unicode punctuation category."""
    return (c.isascii() and not c.isalnum() and 0x21 <= ord(c) <= 0x7E) or unicodedata.category(c).startswith("P")


def normalized_char(c: str) -> str:
    """`BertNormalizer` (clean_text, strip_accents from lowercase, lowercase) of one character."""
    if c in "\t\n\r" or (c in _WHITESPACE and not unicodedata.category(c).startswith("C")):
        return " "
    if c in ("\x00", "\ufffd") or unicodedata.category(c).startswith("C"):
        return ""
    stripped = "".join(x for x in unicodedata.normalize("NFD", c) if unicodedata.category(x) != "Mn")
    return "".join(x.lower() for x in stripped)


class _Tables(NamedTuple):
    other: re.Pattern[str]
    """Finds a character that is not checked."""
    normalize: dict[int, str]
    """`str.translate`'s table: each checked character that normalizing changes."""
    words: re.Pattern[str]
    """A pre-token of a normalized text: one punctuation character, or a run of others up to a space."""


@functools.cache
def tables() -> _Tables:
    """The tables of the checked characters, made once (about 0.1 s) by the first tokenizer."""
    checked = checked_characters()
    punctuation = _char_class(frozenset(x for c in checked for x in normalized_char(c) if _is_punctuation(x)))
    return _Tables(
        other=re.compile(f"[^{_char_class(checked)}]"),
        normalize={ord(c): n for c in checked if (n := normalized_char(c)) != c},
        words=re.compile(f"[{punctuation}]|[^ {punctuation}]+"),
    )


class Encoding(NamedTuple):
    """The part of `tokenizers.Encoding` the encoder reads."""

    ids: list[int]


class WordPieceTokenizer:
    """Encodes as the bundled model's `tokenizers.Tokenizer` (truncated at `max_length` ids, no
    padding) does: `encode(text).ids`, `encode_batch(texts)`. `rust` loads that tokenizer, for
    the texts this one does not take (called at most once)."""

    def __init__(
        self,
        vocab: dict[str, int],
        *,
        max_length: int,
        rust: Callable[[], Any],
        unk: str = "[UNK]",
        cls: str = "[CLS]",
        sep: str = "[SEP]",
        specials: Sequence[str] = (),
        max_chars_per_word: int = 100,
    ) -> None:
        if max_length < 2:
            raise ValueError("max_length must be at least 2 (the special tokens)")
        self._vocab = vocab
        self._unk, self._cls, self._sep = vocab[unk], vocab[cls], vocab[sep]
        self._specials = tuple(specials)
        self._max_length = max_length
        self._max_chars = max_chars_per_word
        self._load_rust = rust
        self._rust: Any = None
        self._tables = tables()
        self.pieces = functools.lru_cache(maxsize=16384)(self._pieces)
        """The ids of one pre-tokenized word (cached: a catalog repeats its words)."""

    @classmethod
    def for_model_dir(cls, model_dir: Path, rust: Callable[[], Any]) -> WordPieceTokenizer | None:
        """This tokenizer for `model_dir`, if its `tokenizer.json` is the BERT layout done here
        (None otherwise: use the Rust tokenizer alone)."""
        spec = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        model, normalizer = spec.get("model") or {}, spec.get("normalizer") or {}
        limits = [v for v in (config.get("model_max_length"), config.get("max_length")) if type(v) is int and v > 0]
        bert = (
            model.get("type") == "WordPiece"
            and model.get("continuing_subword_prefix") == "##"
            and normalizer.get("type") == "BertNormalizer"
            and normalizer.get("clean_text") is True
            and normalizer.get("handle_chinese_chars") is True
            and normalizer.get("strip_accents") in (None, True)
            and normalizer.get("lowercase") is True
            and (spec.get("pre_tokenizer") or {}).get("type") == "BertPreTokenizer"
            and config.get("truncation_side", "right") == "right"
            and _cls_sep(spec.get("post_processor") or {}) == ("[CLS]", "[SEP]")
            and all(not t.get("lstrip") and not t.get("rstrip") for t in spec.get("added_tokens") or [])
        )
        vocab = model.get("vocab")
        if not bert or not limits or not isinstance(vocab, dict) or "[UNK]" not in vocab:
            return None
        specials = [t["content"] for t in spec.get("added_tokens") or []]
        specials += _special_tokens(model_dir)
        return cls(
            vocab,
            max_length=min(limits),
            rust=rust,
            unk=model.get("unk_token", "[UNK]"),
            specials=specials,
            max_chars_per_word=int(model.get("max_input_chars_per_word", 100)),
        )

    def no_padding(self) -> None:
        """Nothing to turn off: this tokenizer never pads (the encoder pads its batches)."""

    @property
    def holds_rust_tokenizer(self) -> bool:
        """Whether a text of an unchecked character (or with a special token's text) has loaded the Rust tokenizer."""
        return self._rust is not None

    def _rust_ids(self, text: str) -> list[int]:
        if self._rust is None:
            self._rust = self._load_rust()
        return list(self._rust.encode(text).ids)

    def _pieces(self, word: str) -> tuple[int, ...]:
        """WordPiece: the longest known prefix, then `##` pieces; `[UNK]` for a word it cannot cover."""
        if len(word) > self._max_chars:
            return (self._unk,)
        vocab, ids, start = self._vocab, [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                found = vocab.get(piece)
                if found is not None:
                    ids.append(found)
                    break
                end -= 1
            else:
                return (self._unk,)
            start = end
        return tuple(ids)

    def ids(self, text: str) -> list[int]:
        """The ids of `text`, `[CLS]` and `[SEP]` included, at most `max_length` of them."""
        other, normalize, words = self._tables
        if other.search(text) is not None or any(s in text for s in self._specials):
            return self._rust_ids(text)
        out: list[int] = []
        room = self._max_length - 2
        for word in words.findall(text.translate(normalize)):
            out.extend(self.pieces(word))
            if len(out) >= room:
                del out[room:]
                break
        return [self._cls, *out, self._sep]

    def encode(self, text: str) -> Encoding:
        return Encoding(self.ids(text))

    def encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
        return [Encoding(self.ids(text)) for text in texts]


def _cls_sep(processor: dict[str, Any]) -> tuple[str, str] | None:
    """The (first, last) special tokens of a single sequence's template, if it is `[A, B] + text + [C]`."""
    if processor.get("type") == "BertProcessing":
        return processor["cls"][0], processor["sep"][0]
    single = processor.get("single") if processor.get("type") == "TemplateProcessing" else None
    if not isinstance(single, list) or len(single) != 3 or "Sequence" not in single[1]:
        return None
    first, last = single[0].get("SpecialToken"), single[2].get("SpecialToken")
    return (first["id"], last["id"]) if first and last else None


def _special_tokens(model_dir: Path) -> list[str]:
    """The texts of `special_tokens_map.json`'s tokens (which the Rust tokenizer keeps whole)."""
    path = model_dir / "special_tokens_map.json"
    tokens = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    out = []
    for value in tokens.values():
        for token in value if isinstance(value, list) else [value]:
            out.append(token["content"] if isinstance(token, dict) else str(token))
    return out
