"""The bundled model's word pieces in Python (`gateway.router.wordpiece`) are the Rust tokenizer's:
every checked character alone and between others, random texts of them, long texts and words;
any other text is the Rust tokenizer's own answer."""

from __future__ import annotations

import random
import subprocess
import sys
from functools import partial

import pytest

from gateway.router import wordpiece
from gateway.router.bundled_model import ASSETS_DIR
from gateway.router.pooling import load_tokenizer
from gateway.router.wordpiece import WordPieceTokenizer, checked_characters, normalized_char, tables
from tests.conftest import REPO


@pytest.fixture(scope="module")
def rust() -> object:
    return load_tokenizer(ASSETS_DIR)


@pytest.fixture
def ours() -> WordPieceTokenizer:
    tokenizer = WordPieceTokenizer.for_model_dir(ASSETS_DIR, partial(load_tokenizer, ASSETS_DIR))
    assert tokenizer is not None
    return tokenizer


def test_every_checked_character_is_normalized_and_split_as_the_rust_tokenizer_does(rust: object) -> None:
    words = tables().words
    checked = sorted(checked_characters())
    assert len(checked) > 4000 and "→" in checked and "é" in checked and "😀" in checked
    for c in checked:
        normal = normalized_char(c)
        assert rust.normalizer.normalize_str(c) == normal, hex(ord(c))  # type: ignore[attr-defined]
        assert [w for w, _ in rust.pre_tokenizer.pre_tokenize_str(normal)] == words.findall(normal), hex(ord(c))  # type: ignore[attr-defined]


def test_texts_of_checked_characters_get_the_rust_tokenizers_ids(rust: object, ours: WordPieceTokenizer) -> None:
    encode = rust.encode  # type: ignore[attr-defined]
    for c in sorted(checked_characters()):
        for text in (c, f"a{c}b", f"Word{c}{c}x y"):
            assert ours.encode(text).ids == encode(text).ids, hex(ord(c))
    alphabet = sorted(checked_characters())
    common = (
        "Create a GitHub issue; list the open pull-requests of repo's café in Zürich — “quoted” 3.14 user_id".split()
    )
    rng = random.Random(29)
    texts = [
        rng.choice([" ", "\n", "\t", ", "]).join(
            rng.choice(common) if rng.random() < 0.6 else "".join(rng.choices(alphabet, k=rng.randint(1, 12)))
            for _ in range(rng.randint(0, 40))
        )
        for _ in range(1500)
    ]
    texts += ["", "word " * 1000, "x" * 100, "x" * 101, "unbelievablyqzxunknownish words", "İstanbul ΣΊΣΥΦΟΣ"]
    assert [e.ids for e in ours.encode_batch(texts)] == [e.ids for e in rust.encode_batch(texts)]  # type: ignore[attr-defined]
    assert len(ours.encode("word " * 1000).ids) == 512
    assert not ours.holds_rust_tokenizer


def test_a_text_with_another_character_or_a_special_tokens_text_is_the_rust_tokenizers(
    rust: object, ours: WordPieceTokenizer
) -> None:
    assert ours.encode("list the files").ids == rust.encode("list the files").ids  # type: ignore[attr-defined]
    assert not ours.holds_rust_tokenizer
    for text in ["天气预报 for Zürich", "a [MASK] b", "x[SEP]y", "\u2065 unassigned", "한국어 검색"]:
        assert ours.encode(text).ids == rust.encode(text).ids, text  # type: ignore[attr-defined]
    assert ours.holds_rust_tokenizer


def test_a_tokenizer_json_of_another_layout_is_left_to_the_rust_tokenizer(tmp_path: object) -> None:
    import json
    import shutil
    from pathlib import Path

    folder = Path(str(tmp_path)) / "model"
    shutil.copytree(ASSETS_DIR, folder)
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["normalizer"]["lowercase"] = False
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    assert WordPieceTokenizer.for_model_dir(folder, partial(load_tokenizer, folder)) is None


def test_the_bundled_embedder_embeds_a_checked_catalog_without_importing_tokenizers() -> None:
    """What the memory is cut for: the Rust tokenizer is not even imported (a fresh process)."""
    program = """
import sys
from gateway.router.bundled_model import ASSETS_DIR, MODEL_FILE, default_model_source
from gateway.router.pooling import mean_pooling_encoder
from gateway.router.wordpiece import WordPieceTokenizer
from gateway.router.pooling import load_tokenizer
tokenizer = WordPieceTokenizer.for_model_dir(ASSETS_DIR, lambda: load_tokenizer(ASSETS_DIR))
encoder = mean_pooling_encoder(default_model_source(), tokenizer, 64, threads=1)
encoder.embed_documents(["add records: insert rows → a table", "Zürich’s weather"], 8)
encoder.embed_query("find the weather")
print("tokenizers" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "False", done.stderr


def test_the_module_keeps_no_table_of_every_checked_character() -> None:
    assert not any(isinstance(v, frozenset) and len(v) > 1000 for v in vars(wordpiece).values())
