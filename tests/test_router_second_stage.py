"""The second stage (issue 30): an LLM judge (the client's model through MCP sampling, or a chat
endpoint) and a `/rerank` endpoint, each against real servers; on any failure the first stage stands."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client

from gateway.config.routing_settings import SecondStageSettings
from gateway.router.base import SearchHit
from gateway.router.index import Router
from gateway.router.second_stage import SecondStage, judge_prompt, parse_verdict
from tests.conftest import NO_EMBEDDINGS, gateway_over_http, gateway_over_stdio, write_config
from tests.test_router import CATALOG

QUERY = "will it rain in Paris tomorrow?"


@pytest.fixture(scope="module")
def hits() -> list[SearchHit]:
    """The first stage's ranking of the router tests' catalog (BM25: no model needed here)."""
    router = Router(None)
    router.update(CATALOG)
    found = router.search(QUERY, k=10)
    assert found[0].name == "weather__get_forecast"
    return found


# --------------------------------------------------------------------------- the verdict


def test_a_verdict_names_candidates_by_number_or_name_best_first(hits: list[SearchHit]) -> None:
    assert parse_verdict('{"fits": [2, 1]}', hits) == [1, 0]
    assert parse_verdict(f'Sure! {{"fits": ["{hits[2].name}", "3", 1]}}', hits) == [2, 0]
    assert parse_verdict('```json\n{"fits": []}\n```', hits) == []


@pytest.mark.parametrize(
    "answer", ["tool 2 fits", '{"fits": [99]}', '{"fits": ["nonexistent__tool"]}', '{"fit": [1]}', '{"fits": 1}', ""]
)
def test_an_answer_that_is_not_a_verdict_is_nonsense_not_none_fits(answer: str, hits: list[SearchHit]) -> None:
    assert parse_verdict(answer, hits) is None


def test_the_judge_reads_the_request_and_numbered_candidates(hits: list[SearchHit]) -> None:
    prompt = judge_prompt(QUERY, hits[:3])
    assert prompt.startswith(f"Request: {QUERY}\n")
    assert f"1. {hits[0].name}: " in prompt and f"3. {hits[2].name}" in prompt and "4. " not in prompt


# --------------------------------------------------------------------------- endpoints in the test


class Endpoint:
    """A real HTTP server on 127.0.0.1 in a thread, answering POSTs with `answer(path, body)`."""

    def __init__(self, answer: Callable[[str, dict[str, Any]], tuple[int, Any]]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, dict[str, Any], str | None]] = []
        self.release = threading.Event()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                endpoint.requests.append((self.path, body, self.headers.get("authorization")))
                status, reply = endpoint.answer(self.path, body)
                if reply == "hang":
                    endpoint.release.wait(30)  # a model that does not answer in time (released at teardown)
                    status, reply = 200, {}
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.fixture
def endpoint() -> Iterator[Callable[[Callable[[str, dict[str, Any]], tuple[int, Any]]], Endpoint]]:
    started: list[Endpoint] = []

    def start(answer: Callable[[str, dict[str, Any]], tuple[int, Any]]) -> Endpoint:
        started.append(Endpoint(answer))
        return started[-1]

    yield start
    for server in started:
        server.close()


def chat(content: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}


async def refine(settings: SecondStageSettings, hits: list[SearchHit], threshold: float = 0.1) -> Any:
    stage = SecondStage(settings, threshold)
    try:
        with anyio.fail_after(30):
            return await stage.refine(QUERY, hits, 5)
    finally:
        await stage.aclose()


@pytest.mark.anyio
async def test_a_chat_endpoint_judge_puts_the_fitting_candidates_first(
    hits: list[SearchHit], endpoint: Callable[..., Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    server = endpoint(lambda path, body: (200, chat('{"fits": [3, 1]}')))
    monkeypatch.setenv("GATEWAY_TEST_JUDGE_KEY", "sk-test")
    settings = SecondStageSettings(
        kind="judge", url=server.url, model="judge-model", api_key_env="GATEWAY_TEST_JUDGE_KEY"
    )
    routing = await refine(settings, hits)
    assert [h.name for h in routing.hits] == [hits[2].name, hits[0].name, hits[1].name, hits[3].name, hits[4].name]
    assert routing.fits and routing.stage == "judge (chat)"
    [(path, body, key)] = server.requests
    assert path == "/v1/chat/completions" and key == "Bearer sk-test" and body["model"] == "judge-model"
    assert body["messages"][0]["role"] == "system" and QUERY in body["messages"][1]["content"]
    assert body["messages"][1]["content"].count("\n") == 2 + 10  # the request, a blank line, 10 candidates


@pytest.mark.anyio
async def test_a_judge_that_says_none_fits_turns_the_ranking_into_hints(
    hits: list[SearchHit], endpoint: Callable[..., Endpoint]
) -> None:
    server = endpoint(lambda path, body: (200, chat('{"fits": []}')))
    routing = await refine(SecondStageSettings(kind="judge", url=server.url), hits)
    assert not routing.fits and [h.name for h in routing.hits] == [h.name for h in hits[:5]]


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ((200, chat("I would use the weather tool.")), "not a verdict"),
        ((200, "hang"), "no answer within 1 s"),
        ((500, {"error": "overloaded"}), "HTTP 500"),
        ((200, {"choices": []}), "no choices[0].message.content"),
    ],
)
@pytest.mark.anyio
async def test_a_judge_that_fails_leaves_the_first_stage_ranking(
    reply: tuple[int, Any], why: str, hits: list[SearchHit], endpoint: Callable[..., Endpoint]
) -> None:
    server = endpoint(lambda path, body: reply)
    timeout = 1 if reply[1] == "hang" else 30  # generous where the answer comes: a loaded machine is slow
    routing = await refine(SecondStageSettings(kind="judge", url=server.url, timeout=timeout), hits)
    assert [h.name for h in routing.hits] == [h.name for h in hits[:5]]
    assert routing.fits  # the first stage's verdict: its best scores above the threshold
    assert routing.stage.startswith("first stage; the judge failed") and why in routing.stage


@pytest.mark.anyio
async def test_a_judge_down_leaves_the_first_stage_ranking(hits: list[SearchHit]) -> None:
    from tests.conftest import free_port

    settings = SecondStageSettings(kind="judge", url=f"http://127.0.0.1:{free_port()}/v1", timeout=5)
    routing = await refine(settings, hits)
    assert [h.name for h in routing.hits] == [h.name for h in hits[:5]] and "unreachable" in routing.stage


@pytest.mark.anyio
async def test_a_cohere_shaped_reranker_reorders_the_candidates_and_the_threshold_still_decides(
    hits: list[SearchHit], endpoint: Callable[..., Endpoint]
) -> None:
    def answer(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        # the reverse order, top 3 only (as `top_n` answers are): the rest keep their order after them
        n = len(body["documents"])
        return 200, {"results": [{"index": n - 1 - i, "relevance_score": 0.9 - i / 10} for i in range(3)]}

    server = endpoint(answer)
    routing = await refine(SecondStageSettings(kind="rerank", url=server.url, model="rerank-v3"), hits)
    assert [h.name for h in routing.hits][:3] == [hits[9].name, hits[8].name, hits[7].name]
    assert routing.hits[3].name == hits[0].name and routing.stage == "rerank" and routing.fits
    [(path, body, _)] = server.requests
    assert path == "/v1/rerank" and body["query"] == QUERY and body["model"] == "rerank-v3"
    assert body["documents"][0].startswith("get forecast")  # the tool's indexed text
    none_fits = await refine(SecondStageSettings(kind="rerank", url=server.url), hits, threshold=0.99)
    assert not none_fits.fits


@pytest.mark.anyio
async def test_a_tei_shaped_reranker_is_asked_again_with_texts(
    hits: list[SearchHit], endpoint: Callable[..., Endpoint]
) -> None:
    def answer(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if "texts" not in body:
            return 422, {
                "error": "Failed to deserialize the JSON body: missing field `texts`",
                "error_type": "Validation",
            }
        return 200, [{"index": 1, "score": 0.8}, {"index": 0, "score": 0.1}]

    server = endpoint(answer)
    routing = await refine(SecondStageSettings(kind="rerank", url=server.url + "/rerank"), hits[:2])
    assert [h.name for h in routing.hits] == [hits[1].name, hits[0].name]
    assert [path for path, _, _ in server.requests] == ["/v1/rerank", "/v1/rerank"]


@pytest.mark.anyio
async def test_a_reranker_answering_nonsense_leaves_the_first_stage_ranking(
    hits: list[SearchHit], endpoint: Callable[..., Endpoint]
) -> None:
    server = endpoint(lambda path, body: (200, {"results": [{"index": 42, "relevance_score": 1.0}]}))
    routing = await refine(SecondStageSettings(kind="rerank", url=server.url), hits)
    assert [h.name for h in routing.hits] == [h.name for h in hits[:5]] and "outside" in routing.stage


def test_a_reranker_without_a_url_is_a_settings_error() -> None:
    with pytest.raises(ValueError, match="kind rerank needs url"):
        SecondStageSettings(kind="rerank")


# --------------------------------------------------------------------------- the client's own model


Opener = Callable[..., AbstractAsyncContextManager[Client]]


@pytest.mark.parametrize("opener", [gateway_over_stdio, gateway_over_http], ids=["stdio", "http"])
@pytest.mark.anyio
async def test_the_judge_asks_the_clients_own_model_through_sampling_and_survives_its_failures(
    opener: Opener, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "gw.yaml", "mcps: {}\n")
    env = NO_EMBEDDINGS | {
        "GATEWAY_ROUTING__MODE": "search",
        "GATEWAY_SECOND_STAGE__KIND": "judge",
        "GATEWAY_SECOND_STAGE__TIMEOUT": "10",  # the hanging model costs this once; the others answer
    }
    behaviour = {"answer": "echo"}
    asked: list[types.CreateMessageRequestParams] = []
    released = anyio.Event()

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        asked.append(params)
        prompt = params.messages[0].content
        assert isinstance(prompt, types.TextContent)
        lines = [line for line in prompt.text.splitlines() if line[:1].isdigit()]
        text = {
            "echo": json.dumps({"fits": [next(i for i, line in enumerate(lines, 1) if ". mem__echo:" in line)]}),
            "none": '{"fits": []}',
            "nonsense": "Probably the adding one?",
        }.get(behaviour["answer"], "")
        if behaviour["answer"] == "hang":
            with anyio.move_on_after(30):
                await released.wait()
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text=text), model="client-model"
        )

    query = {"query": "add two integers together", "limit": 3}
    with anyio.fail_after(120):
        async with opener(config, tmp_path, env, mode="legacy", sampling_callback=sampling) as client:
            judged = await client.call_tool("search_tools", query)
            assert [t["name"] for t in (judged.structured_content or {})["tools"]][0] == "mem__echo"
            assert asked[0].system_prompt and "fits" in asked[0].system_prompt and asked[0].max_tokens == 200
            assert "Request: add two integers together" in asked[0].messages[0].content.text  # type: ignore[union-attr]

            behaviour["answer"] = "none"
            refused = await client.call_tool("search_tools", query)
            assert (refused.structured_content or {})["no_tool_fits"] is True

            for failure in ("nonsense", "hang"):
                behaviour["answer"] = failure
                first = await client.call_tool("search_tools", query)
                assert not first.is_error
                assert [t["name"] for t in (first.structured_content or {})["tools"]][0] == "mem__add", failure
            released.set()
