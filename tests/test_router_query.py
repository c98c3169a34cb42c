"""`compact_query`: the request text the embedding model reads."""

from __future__ import annotations

import pytest

from gateway.router.query import compact_query, cut_query


@pytest.mark.parametrize(
    ("request_text", "expected"),
    [
        (
            "Analyze Apple's stock and summarize it in a PPT in /root/ppt/apple.pptx.",
            "Analyze Apple's stock summarize PPT file pptx.",
        ),
        ("Save the list to ~/notes/todo.md, then mail it", "Save list file md, mail"),
        ("Copy the folder /tmp/out/ to ./backup", "Copy folder folder folder"),
        ("Open C:\\Users\\me\\report.docx please", "Open file docx"),
        ("Run a full reconnaissance on www.baidu.com.", "Run full reconnaissance URL."),
        ("Summarize https://example.com/a?b=1, then reply", "Summarize URL, reply"),
        ("Write to bob.smith@example.org about it", "Write email address"),
        ("I'd like you to please help me find the weather", "like help find weather"),
    ],
)
def test_paths_urls_and_stopwords_are_compacted(request_text: str, expected: str) -> None:
    assert compact_query(request_text) == expected


def test_words_that_only_look_like_paths_are_kept() -> None:
    assert compact_query("read/write access and 3/4 of the budget") == "read/write access 3/4 budget"


def test_cjk_text_is_kept_and_paths_in_it_are_compacted() -> None:
    assert compact_query("把文件保存到 /root/a.txt") == "把文件保存到 file txt"


def test_a_request_of_stopwords_only_is_left_as_written() -> None:
    assert compact_query("  what is this  ") == "what is this"
    assert compact_query("/") == "/"


def test_a_request_is_cut_to_its_limit_at_a_space_and_a_short_one_is_only_stripped() -> None:
    assert cut_query("  add two integers  ", 100) == "add two integers"
    long = "add two integers " * 1_000
    cut = cut_query(long, 100)
    assert len(cut) <= 100 and long.startswith(cut + " ") and cut.endswith("add two")  # a whole word last
    assert cut_query("x" * 1_000_000, 100) == "x" * 100  # no space: cut at the limit
