"""The router on an OpenAI-compatible embeddings endpoint (issue 30), against a real HTTP server.

`tests/servers/embeddings_server.py` serves the bundled model's vectors over
`POST /v1/embeddings` from a child process, so the endpoint can be killed mid-run.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import Client

from gateway.config.routing_settings import EmbeddingSettings, RoutingSettings
from gateway.config.settings import Settings
from gateway.registry import Registry
from gateway.router.base import Embedder
from gateway.router.eval import evaluate
from gateway.router.eval_sets import load_set
from gateway.router.index import Router
from gateway.router.model_loading import load_embedder
from gateway.router.remote_embedder import EndpointEmbedder
from gateway.router.service import RouterService, build_router
from gateway.serving.server import GatewayServer
from gateway.upstreams.upstream import UpstreamSpec
from tests.conftest import REPO, START_DEADLINE, _read_line_with_prefix, free_port, gateway_env, stop_process
from tests.servers.demo_server import create_server
from tests.test_router import CATALOG, QUERIES, DictCache, _write_eval_files

SERVER = REPO / "tests" / "servers" / "embeddings_server.py"
MODEL = "all-minilm-l6-v2"


def start_embeddings_server(data_dir: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """The test's embeddings server as a child process; returns it and its base URL (`.../v1`)."""
    process = subprocess.Popen(
        [sys.executable, str(SERVER), "--data-dir", str(data_dir), "--model", MODEL, *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    port = _read_line_with_prefix(process.stdout, "PORT=", START_DEADLINE, process)  # it loads the model first
    return process, f"http://127.0.0.1:{port}/v1"


@pytest.fixture(scope="module")
def endpoint(model_data_dir: Path, embedder: Embedder) -> Iterator[str]:
    """One server for the module's read-only tests (`embedder` has assembled the bundled model)."""
    process, url = start_embeddings_server(model_data_dir)
    try:
        yield url
    finally:
        stop_process(process)


def texts_embedded(url: str) -> int:
    stats = httpx2.get(url.removesuffix("/v1") + "/stats", timeout=10).json()
    return int(stats["texts"])


def test_an_endpoint_serving_the_bundled_model_ranks_the_test_catalog_as_the_model_in_process(
    endpoint: str, embedder: Embedder
) -> None:
    remote = Router(EndpointEmbedder(endpoint, MODEL, query_timeout=30))
    local = Router(embedder)
    for router in (remote, local):
        router.update(CATALOG)
        router.enrich()
    assert remote.status == "embeddings + BM25" and not remote.degraded
    for query, expected in QUERIES:
        got = remote.search(query, k=3)
        want = local.search(query, k=3)
        assert got[0].name == expected
        assert [h.name for h in got] == [h.name for h in want]
        assert [round(h.score, 3) for h in got] == pytest.approx([round(h.score, 3) for h in want], abs=0.002)


def _dev_set(name: str) -> Path:
    """A dev set of `docs/benchmarks.md`, copied with its licence under `tests/data/eval/` so that
    this test runs wherever the suite does."""
    return REPO / "tests" / "data" / "eval" / name


@pytest.mark.parametrize("name", ["livemcpbench", "metatool"])
def test_an_endpoint_serving_the_bundled_model_gives_the_recall_of_the_model_in_process_on_a_dev_set(
    name: str, endpoint: str, embedder: Embedder
) -> None:
    folder = _dev_set(name)
    dev = load_set(folder / "catalog.json", folder / "queries.jsonl")
    remote = evaluate(dev.records, dev.queries, (1, 5, 10), EndpointEmbedder(endpoint, MODEL, query_timeout=30))
    local = evaluate(dev.records, dev.queries, (1, 5, 10), embedder)
    for k in (1, 5, 10):
        assert remote.recall[k] == pytest.approx(local.recall[k], abs=0.005), (k, remote.recall, local.recall)


def test_vectors_are_cached_by_backend_and_model_so_a_switch_re_embeds(
    model_data_dir: Path, embedder: Embedder
) -> None:
    process, url = start_embeddings_server(model_data_dir)
    try:
        cache = DictCache()
        Router(embedder, cache=cache).update(CATALOG)  # the bundled model in process fills the cache
        Router(EndpointEmbedder(url, MODEL), cache=cache).update(CATALOG)
        first = texts_embedded(url)
        assert first >= len(CATALOG)  # another backend: nothing taken from the in-process model's vectors
        Router(EndpointEmbedder(url, MODEL), cache=cache).update(CATALOG)
        assert texts_embedded(url) == first + 1  # the same backend and model: only the dimension probe
    finally:
        stop_process(process)


def test_a_wrong_key_or_model_routes_with_bm25_and_says_why(model_data_dir: Path, embedder: Embedder) -> None:
    process, url = start_embeddings_server(model_data_dir, "--key", "right")
    try:
        for remote in (EndpointEmbedder(url, MODEL, api_key="wrong"), EndpointEmbedder(url, "other", api_key="right")):
            router = Router(remote)
            router.update(CATALOG)
            assert router.degraded and router.needs_embedding
            assert "HTTP 401" in router.status or "HTTP 404" in router.status
            assert url in router.status
            assert router.search("will it rain in Paris tomorrow?", k=3)[0].name == "weather__get_forecast"
        good = Router(EndpointEmbedder(url, MODEL, api_key="right"))
        good.update(CATALOG)
        assert good.status == "embeddings + BM25"
    finally:
        stop_process(process)


def test_an_endpoint_that_is_not_configured_fully_loads_no_model(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    assert load_embedder(EmbeddingSettings(url="http://127.0.0.1:9/v1"), Path("/nonexistent")) is None
    assert "GATEWAY_EMBEDDING__MODEL is not" in caplog.text
    settings = EmbeddingSettings(url="http://127.0.0.1:9/v1", model=MODEL, api_key_env="GATEWAY_TEST_NO_SUCH_KEY")
    assert load_embedder(settings, Path("/nonexistent")) is None
    assert "GATEWAY_TEST_NO_SUCH_KEY" in caplog.text


def test_an_endpoint_down_at_start_up_is_used_once_it_answers(
    model_data_dir: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    settings = EmbeddingSettings(url=f"http://127.0.0.1:{port}/v1", model=MODEL, retry_seconds=0.01, query_timeout=30)
    remote = load_embedder(settings, model_data_dir)
    assert isinstance(remote, EndpointEmbedder)  # down now, but configured: BM25 until it answers
    assert "does not answer" in caplog.text
    router = Router(remote)
    router.update(CATALOG)
    assert router.needs_embedding
    process, _ = start_embeddings_server(model_data_dir, "--port", str(port))
    try:
        router.update(CATALOG)
        assert not router.degraded and router.dense
        assert router.search("open a PR for my feature branch", k=1)[0].name == "github__create_pull_request"
    finally:
        stop_process(process)


@pytest.mark.anyio
async def test_the_endpoint_killed_mid_run_falls_back_to_bm25_with_a_status_never_an_error_to_the_client(
    tmp_path: Path, model_data_dir: Path, embedder: Embedder, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    process, url = start_embeddings_server(model_data_dir)
    settings = Settings(
        data_dir=tmp_path / "data",
        routing=RoutingSettings(mode="search", no_fit_threshold=0.0, search_timeout=60),
        embedding=EmbeddingSettings(url=url, model=MODEL, retry_seconds=0.05, query_timeout=30),
    )
    upstream = UpstreamSpec(id="mem", prefix="mem", transport="memory", target=create_server("mem"))
    registry = Registry([upstream], settings)
    try:
        with anyio.fail_after(120):
            async with registry.running():
                service = RouterService(registry, settings, lambda: build_router(settings, None))
                registry.task_group.start_soon(service.run)
                await registry.wait_settled()
                await service.complete.wait()
                assert service.status == "embeddings + BM25"
                gateway = GatewayServer(registry, settings, service)
                async with Client(gateway.server) as client:
                    query = {"query": "add two integers together", "limit": 3}
                    before = await client.call_tool("search_tools", query)
                    assert not before.is_error
                    stop_process(process)  # killed mid-run
                    after = await client.call_tool("search_tools", query)
                    assert not after.is_error
                    found = (after.structured_content or {})["tools"]
                    assert found[0]["name"] == "mem__add"  # BM25 still finds it
                    assert service.router is not None and service.router.degraded
                    assert service.status.startswith("BM25 only while the embedding model is unavailable")
                    assert url in service.status
                    assert "BM25 only while the embedding model is unavailable" in caplog.text
                    assert service.figures().semantic is False  # mcp_gateway_router_semantic 0 meanwhile
                    # a restarted endpoint is used again at the first search after the retry delay
                    port = url.removeprefix("http://127.0.0.1:").split("/")[0]
                    process, _ = start_embeddings_server(model_data_dir, "--port", port)
                    await anyio.sleep(0.1)  # past retry_seconds: the next search tries the endpoint
                    again = await client.call_tool("search_tools", query)
                    assert not again.is_error
                    assert service.status == "embeddings + BM25" and service.figures().semantic
                    assert "answers again" in caplog.text
                registry.task_group.cancel_scope.cancel()
    finally:
        stop_process(process)


def test_eval_runs_with_the_endpoint_and_reports_it(tmp_path: Path, endpoint: str) -> None:
    catalog_path, queries_path = _write_eval_files(tmp_path)
    env = gateway_env(tmp_path)
    env.update(GATEWAY_EMBEDDING__URL=endpoint, GATEWAY_EMBEDDING__MODEL=MODEL)
    args = ["eval", "--catalog", str(catalog_path), "--queries", str(queries_path), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["embedding"] == f"openai-embeddings {MODEL} at {endpoint}/embeddings"
    assert f"embedding: openai-embeddings {MODEL} at {endpoint}/embeddings" in done.stdout
    assert figures["recall@1"] >= 0.4


def test_eval_with_an_endpoint_that_is_down_says_its_figures_are_bm25s(tmp_path: Path) -> None:
    catalog_path, queries_path = _write_eval_files(tmp_path)
    env = gateway_env(tmp_path)
    url = f"http://127.0.0.1:{free_port()}/v1"
    env.update(GATEWAY_EMBEDDING__URL=url, GATEWAY_EMBEDDING__MODEL=MODEL)
    args = ["eval", "--catalog", str(catalog_path), "--queries", str(queries_path), "--json"]
    done = subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert "unreachable" in figures["embedding_failure"] and figures["router"].startswith("weighted")
    assert "FAILED during the run, so these figures are partly BM25 alone's" in done.stdout
