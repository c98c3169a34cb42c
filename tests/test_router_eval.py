"""`mcp-gateway eval` on several sets: baselines beside the router, the worst set, long requests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.router.abstain import format_abstain, pick_threshold, run_abstain
from gateway.router.eval import EvalQuery, load_catalog, load_queries
from gateway.router.eval_sets import BASELINES, format_multi_report, load_set, run_sets
from gateway.router.long_requests import MAX_STEPS, MIN_STEPS, long_requests
from tests.conftest import REPO, gateway_env
from tests.test_router import write_eval_files

ZOO = {
    "servers": [
        {
            "name": "zoo",
            "tools": [
                {"name": "feed_zebra", "description": "Feed the zebra"},
                {"name": "wash_elephant", "description": "Wash the elephant"},
            ],
        },
        {"name": "kitchen", "tools": [{"name": "bake_bread", "description": "Bake bread in the oven"}]},
    ]
}
ZOO_QUERIES = [
    {"id": "a", "query": "feed the zebra", "expected": [[{"server": "zoo", "tool": "feed_zebra"}]]},
    {"id": "b", "query": "bake some bread", "expected": [[{"server": "kitchen", "tool": "bake_bread"}]]},
]
HARD_QUERIES = [
    {
        "id": "c",
        "query": "the big grey animal needs a bath",
        "expected": [[{"server": "zoo", "tool": "wash_elephant"}]],
    },
    {"id": "d", "query": "feed the zebra", "expected": [[{"server": "zoo", "tool": "feed_zebra"}]]},
]


def _two_sets(tmp_path: Path) -> tuple[Path, Path]:
    easy, hard = tmp_path / "easy", tmp_path / "hard"
    easy.mkdir()
    hard.mkdir()
    write_eval_files(easy, ZOO, ZOO_QUERIES)
    write_eval_files(hard, ZOO, HARD_QUERIES)
    return easy, hard


def test_several_sets_are_reported_each_and_by_their_worst(tmp_path: Path) -> None:
    easy, hard = _two_sets(tmp_path)
    sets = [load_set(d / "catalog.json", d / "queries.jsonl") for d in (easy, hard)]
    assert [s.name for s in sets] == ["easy", "hard"]
    report = run_sets(sets, [1, 5], None)
    # without a model only the BM25 baseline runs beside the router (which is BM25 too)
    assert list(report.sets["easy"]) == ["router", "bm25"]
    assert report.sets["easy"]["router"].recall[1] == 1.0
    assert report.sets["hard"]["router"].recall[1] == 0.5  # "bath" matches nothing
    worst = report.worst("router")
    assert worst["recall@1"] == (0.5, "hard")
    assert worst["recall@5"] == (1.0, "easy")  # a tie: the first set
    figures = report.to_json()
    assert figures["worst"]["bm25"]["recall@1"] == {"value": 0.5, "set": "hard"}
    assert figures["sets"]["easy"]["router"]["recall@1"] == 1.0
    text = format_multi_report(report)
    assert "worst" in text and "hard" in text and "recall@1: hard" in text


def test_two_sets_of_one_name_are_refused(tmp_path: Path) -> None:
    easy, _ = _two_sets(tmp_path)
    one = load_set(easy / "catalog.json", easy / "queries.jsonl")
    with pytest.raises(ValueError, match="two sets are named 'easy'"):
        run_sets([one, one], [1], None)


def test_the_baselines_are_plain_bm25_dense_and_rrf_over_the_request_as_written() -> None:
    assert {name: (c.fusion, c.query_text, c.split) for name, c in BASELINES.items()} == {
        "bm25": ("bm25", "compact", "off"),
        "dense": ("dense", "raw", "off"),
        "rrf": ("rrf", "raw", "off"),
    }


def _singles(n_tools: int, per_tool: int) -> list[EvalQuery]:
    return [
        EvalQuery(id=f"{t}-{i}", query=f"request {i} for tool {t}", expected=(frozenset({f"s__t{t}"}),))
        for t in range(n_tools)
        for i in range(per_tool)
    ]


def test_long_requests_join_three_to_five_single_tool_requests_of_different_tools() -> None:
    singles = _singles(10, 4)
    two_tool = EvalQuery(id="x", query="two at once", expected=(frozenset({"a"}), frozenset({"b"})))
    built = long_requests([*singles, two_tool], seed=3)
    assert built == long_requests([*singles, two_tool], seed=3)  # deterministic
    assert built != long_requests(singles, seed=4)
    assert len(built) >= 8
    for q in built:
        assert MIN_STEPS <= len(q.expected) <= MAX_STEPS
        assert len(set(q.expected)) == len(q.expected)  # one tool per step, all different
        assert "two at once" not in q.query
        parts = [s for s in singles if s.expected[0] in q.expected and s.query[1:] in q.query]
        assert len(parts) >= len(q.expected)  # each step is a single-tool request of its tool
    assert len(long_requests(singles, seed=0, limit=2)) == 2


def test_a_long_request_reads_as_one_paragraph_of_its_steps() -> None:
    steps = [
        EvalQuery(id="1", query='"What is the weather in Oslo"', expected=(frozenset({"w"}),)),
        EvalQuery(id="2", query="Book a table for two.", expected=(frozenset({"r"}),)),
        EvalQuery(id="3", query="I need a taxi at 8?", expected=(frozenset({"t"}),)),
    ]
    (built,) = long_requests(steps, seed=0)
    assert built.expected == tuple(s.expected[0] for s in sorted(steps, key=lambda s: built.query.find(s.query[1:6])))
    assert '"' not in built.query and "What is the weather in Oslo." in built.query
    assert "I need a taxi at 8?" in built.query  # "I" keeps its capital after a connective
    assert built.query.count(".") + built.query.count("?") == 3


def test_eval_on_the_command_line_takes_several_sets_and_a_long_set(tmp_path: Path) -> None:
    easy, hard = _two_sets(tmp_path)
    env = gateway_env(tmp_path)
    env["GATEWAY_EMBEDDING__ENABLED"] = "false"
    command = [sys.executable, "-m", "gateway", "eval", "--set", str(easy), "--set", str(hard), "--baselines"]
    done = subprocess.run([*command, "--json"], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(figures["sets"]) == {"easy", "hard"}
    assert figures["worst"]["router"]["recall@1"]["set"] == "hard"
    assert "worst" in done.stdout
    queries = load_queries(easy / "queries.jsonl")
    assert len(load_catalog(easy / "catalog.json")) == 3 and len(queries) == 2
    paired = subprocess.run(
        [sys.executable, "-m", "gateway", "eval", "--catalog", str(easy / "catalog.json")]
        + ["--queries", str(easy / "queries.jsonl"), "--queries", str(hard / "queries.jsonl"), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert paired.returncode == 0, paired.stderr
    assert set(json.loads(paired.stdout.strip().splitlines()[-1])["sets"]) == {"easy", "hard"}
    bad = subprocess.run([*command, "--replay"], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert bad.returncode == 2 and "--replay measures one set" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "gateway", "eval", "--long", str(tmp_path / "nowhere"), "--set", str(easy)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert missing.returncode == 2 and "a folder holding catalog.json and queries.jsonl" in missing.stderr


# --------------------------------------------------------------------------- eval --abstain


def test_abstention_hides_the_expected_servers_and_counts_what_still_passes(tmp_path: Path) -> None:
    easy, _ = _two_sets(tmp_path)
    s = load_set(easy / "catalog.json", easy / "queries.jsonl")
    nothing = EvalQuery(id="none", query="tune the piano", expected=())
    report = run_abstain("easy", s.records, [*s.queries, nothing], None, thresholds=(0.0, 0.3, 1.01))
    assert report.requests == 2 and report.empty_requests == 1
    # "feed the zebra" with zoo hidden: only kitchen is left, and it shares no word with the request
    assert report.false_accept == {0.0: 1.0, 0.3: 0.0, 1.01: 0.0}
    assert report.recall_lost[0.0] == 0.0 and report.recall_lost[0.3] == 0.0
    assert report.recall_lost[1.01] == 1.0  # every request is refused: all its recall is lost
    assert report.empty_accept == {0.0: 1.0, 0.3: 0.0, 1.01: 0.0}
    assert pick_threshold([report]) == 0.3
    assert pick_threshold([report], max_lost=-1) is None
    text = format_abstain([report], configured=0.3)
    assert "<- picked <- configured" in text and "requests with nothing expected answered at 0.3: 0.0%" in text
    assert report.to_json()["thresholds"]["0.3"] == {"false_accept": 0.0, "recall@5_lost": 0.0, "empty_accept": 0.0}


def test_eval_abstain_on_the_command_line_reports_each_set_and_the_pick(tmp_path: Path) -> None:
    easy, hard = _two_sets(tmp_path)
    env = gateway_env(tmp_path)
    env["GATEWAY_EMBEDDING__ENABLED"] = "false"
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "eval", "--set", str(easy), "--set", str(hard), "--abstain", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])["abstain"]
    assert figures["configured"] == 0.17 and set(figures["sets"]) == {"easy", "hard"}
    assert figures["sets"]["easy"]["requests"] == 2
    assert "abstention (expected servers hidden)" in done.stdout
