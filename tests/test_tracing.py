"""Tracing (`gateway.observability.tracing`) end to end: a real client, a real gateway process and a
real instrumented upstream, all exporting to a real OTLP/HTTP receiver on 127.0.0.1 (`tests.otlp_receiver`).

The test process itself installs no tracer provider: the client's trace context is written into
the request (`_meta` or the `traceparent` header) by hand, as an instrumented client would.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.conftest import (
    DEMO_SERVER,
    NO_EMBEDDINGS,
    REPO,
    START_DEADLINE,
    _read_line_with_prefix,
    gateway_env,
    start_gateway_http,
    stop_process,
    write_config,
)
from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = pytest.mark.anyio

TRACED_SERVER = REPO / "tests" / "servers" / "traced_server.py"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
HEADER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
HEADER_SPAN = "00f067aa0ba902b7"


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def otel_env(receiver: OtlpReceiver) -> dict[str, str]:
    """Export to the receiver at once-ish: a batch every 100 ms."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }


@contextmanager
def traced_upstream(receiver: OtlpReceiver, transport: str = "http") -> Iterator[str]:
    """The traced server over streamable HTTP, or with `transport="sse"` the legacy HTTP+SSE transport."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "OTEL_"))} | otel_env(receiver)
    process = subprocess.Popen(
        [sys.executable, str(TRACED_SERVER), transport],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
        env=env | {"PYTHONPATH": str(REPO)},
    )
    try:
        port = _read_line_with_prefix(process.stdout, "PORT=", START_DEADLINE, process)  # type: ignore[arg-type]
        yield f"http://127.0.0.1:{port}/{'sse' if transport == 'sse' else 'mcp'}"
    finally:
        stop_process(process)


def gateway_tracing_env(receiver: OtlpReceiver) -> dict[str, str]:
    return (
        NO_EMBEDDINGS
        | otel_env(receiver)
        | {
            "GATEWAY_TRACING__ENABLED": "true",
            "GATEWAY_LOG_FORMAT": "json",
            "GATEWAY_LOG_LEVEL": "INFO",
        }
    )


def child_config(tmp_path: Path) -> Path:
    """A gateway config with the demo server as its one stdio child, `child`."""
    return write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          child:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, child]
        """,
    )


def one(spans: list[ReceivedSpan], **match: str) -> ReceivedSpan:
    found = [s for s in spans if all(getattr(s, k) == v for k, v in match.items())]
    assert len(found) == 1, (match, [(s.service, s.name, s.trace_id) for s in spans])
    return found[0]


def text_of(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


async def test_an_sse_upstreams_requests_carry_the_calls_trace_in_their_traceparent_header(tmp_path: Path) -> None:
    """`transport: sse` goes over the same client as streamable HTTP, trace header included."""
    with OtlpReceiver().running() as receiver, traced_upstream(receiver, "sse") as upstream_url:
        config = write_config(tmp_path / "gateway.yaml", f"mcps:\n  up:\n    url: {upstream_url}\n    transport: sse\n")
        process, url = start_gateway_http(config, tmp_path, gateway_tracing_env(receiver))
        try:
            with anyio.fail_after(60):
                async with Client(url) as client:
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
                    raw = text_of(await client.call_tool("up__traceparent_headers", {}, meta=meta))
        finally:
            stop_process(process)
    headers = json.loads(raw)
    assert any(header.split("-")[1] == CLIENT_TRACE for header in headers), headers


async def test_a_traced_call_is_one_trace_from_the_client_through_the_gateway_to_the_upstream(tmp_path: Path) -> None:
    with OtlpReceiver().running() as receiver, traced_upstream(receiver) as upstream_url:
        config = write_config(tmp_path / "gateway.yaml", f"mcps:\n  up:\n    url: {upstream_url}\n")
        log = tmp_path / "gateway.log"
        process, url = start_gateway_http(config, tmp_path, gateway_tracing_env(receiver), log=log)
        try:
            with anyio.fail_after(60):
                async with Client(url) as client:
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
                    result = await client.call_tool("up__echo", {"text": "hi"}, meta=meta)
                    assert text_of(result) == "hi"
                    bad = await client.call_tool("up__echo", {"text": 5}, meta=meta)
                    assert bad.is_error
                    headers = json.loads(text_of(await client.call_tool("up__traceparent_headers", {})))
                # Only the HTTP header carries the context now, as for a client traced at its HTTP layer.
                header = {"traceparent": traceparent(HEADER_TRACE, HEADER_SPAN)}
                async with create_mcp_http_client(headers=header) as http:
                    async with Client(streamable_http_client(url, http_client=http)) as client:
                        assert text_of(await client.call_tool("up__echo", {"text": "by header"})) == "by header"

                def complete(spans: list[ReceivedSpan]) -> bool:
                    upstream = [s for s in spans if s.service == "traced-upstream" and s.name == "tools/call echo"]
                    ours = [s for s in spans if s.service == "mcp-gateway" and s.name == "tools/call up__echo"]
                    return len(upstream) >= 2 and len(ours) >= 3

                spans = await anyio.to_thread.run_sync(receiver.wait_for, complete, 30)
        finally:
            stop_process(process)

    traced = [s for s in spans if s.trace_id == CLIENT_TRACE]
    servers = [s for s in traced if s.service == "mcp-gateway" and s.kind == "SERVER"]
    [ok, failed] = sorted(servers, key=lambda s: s.status == "ERROR")
    for server in (ok, failed):
        assert server.name == "tools/call up__echo" and server.parent_id == CLIENT_SPAN
        assert server.attributes["mcp_gateway.server.id"] == "up"
        assert server.attributes["mcp_gateway.tool.upstream_name"] == "echo"
        assert server.attributes["gen_ai.tool.name"] == "up__echo"
        assert server.attributes["mcp.method.name"] == "tools/call"
        assert server.attributes["mcp.protocol.version"] == "2026-07-28"  # a session id only in the handshake era
        assert "gen_ai.tool.call.arguments" not in server.attributes  # not unless a setting allows it

    # The call that went through: server span -> validation, attempt -> client span -> the upstream's server span.
    children = [s for s in traced if s.parent_id == ok.span_id]
    validation = one(children, name="gateway.validation")
    attempt = one(children, name="gateway.attempt")
    assert validation.status == attempt.status == "UNSET" and attempt.attributes["mcp_gateway.attempt"] == 1
    client = one(traced, parent_id=attempt.span_id)
    assert client.kind == "CLIENT" and client.service == "mcp-gateway" and client.name == "MCP send tools/call echo"
    upstream = one(traced, parent_id=client.span_id)
    assert upstream.service == "traced-upstream" and upstream.kind == "SERVER" and upstream.name == "tools/call echo"
    assert ok.attributes["mcp_gateway.result.size"] == 2 and ok.attributes["mcp_gateway.attempts"] == 1
    # The HTTP upstream got the context in its request headers too: the gateway's client span's.
    assert traceparent(CLIENT_TRACE, client.span_id) in headers

    # The call the validation refused: the error code and status on its spans, and nothing sent.
    assert failed.status == "ERROR" and failed.attributes["mcp_gateway.error.code"] == "invalid_arguments"
    refused = one(traced, parent_id=failed.span_id)
    assert refused.name == "gateway.validation" and refused.status == "ERROR"
    assert refused.attributes["error.type"] == "invalid_arguments" and "parameter 'text'" in refused.status_message

    # The `traceparent` header alone continues the client's trace through to the upstream.
    by_header = one(spans, trace_id=HEADER_TRACE, service="mcp-gateway", kind="SERVER", name="tools/call up__echo")
    assert by_header.parent_id == HEADER_SPAN
    assert one(spans, trace_id=HEADER_TRACE, service="traced-upstream", name="tools/call echo")

    # The records keep each call's trace id, and the CSV export carries it.
    exported = tmp_path / "csv"
    subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(config), "stats", "--csv", str(exported)],
        env=gateway_env(tmp_path),
        cwd=REPO,
        check=True,
        capture_output=True,
        timeout=60,
    )
    with (exported / "executions.csv").open() as f:
        rows = list(csv.DictReader(f))
    by_tool = {(row["tool"], row["status"]): row["trace_id"] for row in rows}
    assert by_tool[("up__echo", "success")] in (CLIENT_TRACE, HEADER_TRACE)
    assert by_tool[("up__echo", "error")] == CLIENT_TRACE

    # JSON logs: every log line is one object (the start-up lines, "mcp-gateway: serving on ...", are not log lines).
    lines = [line for line in log.read_text().splitlines() if not line.startswith("mcp-gateway: ")]
    assert lines and all(isinstance(json.loads(line), dict) for line in lines)


async def test_a_retried_call_shows_one_span_per_attempt_and_its_log_lines_carry_its_trace_id(tmp_path: Path) -> None:
    marker = tmp_path / "lookups"
    config = child_config(tmp_path)
    with OtlpReceiver().running() as receiver:
        log = tmp_path / "gateway.log"
        env = gateway_tracing_env(receiver) | {"GATEWAY_RESILIENCE__RETRY_MAX_SECONDS": "30"}
        process, url = start_gateway_http(config, tmp_path, env, log=log)
        try:
            with anyio.fail_after(90):
                async with Client(url) as client:
                    pid = int(text_of(await client.call_tool("child__pid", {})))
                    outcome: list[types.CallToolResult] = []
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}

                    async def lookup() -> None:
                        arguments = {"seconds": 1, "marker": str(marker)}
                        outcome.append(await client.call_tool("child__slow_lookup", arguments, meta=meta))

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(lookup)
                        while not marker.exists():
                            await anyio.sleep(0.02)
                        os.kill(pid, signal.SIGKILL)
                    assert text_of(outcome[0]) == "looked up in 1.0"

                def complete(spans: list[ReceivedSpan]) -> bool:
                    return any(s.trace_id == CLIENT_TRACE and s.kind == "SERVER" for s in spans)

                spans = await anyio.to_thread.run_sync(receiver.wait_for, complete, 30)
        finally:
            stop_process(process)

    server = one(spans, trace_id=CLIENT_TRACE, kind="SERVER")
    attempts = sorted(
        (s for s in spans if s.parent_id == server.span_id and s.name == "gateway.attempt"),
        key=lambda s: s.attributes["mcp_gateway.attempt"],
    )
    # The killed attempt, then (an attempt may meet the child still restarting) the one that answered.
    count = server.attributes["mcp_gateway.attempts"]
    assert count >= 2 and [a.attributes["mcp_gateway.attempt"] for a in attempts] == list(range(1, count + 1))
    assert all(a.status == "ERROR" and a.attributes["error.type"] == "upstream_unavailable" for a in attempts[:-1])
    assert attempts[-1].status == "UNSET"
    # The first and the last attempt sent a request upstream, each its own.
    for attempt in (attempts[0], attempts[-1]):
        assert one(spans, parent_id=attempt.span_id, kind="CLIENT").name == "MCP send tools/call slow_lookup"

    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    retrying = [line for line in lines if line["message"].startswith("retrying 'child__slow_lookup'")]
    assert retrying and all(line["trace_id"] == CLIENT_TRACE for line in retrying)
    assert all(line["server"] == "child" and line["tool"] == "child__slow_lookup" for line in retrying)
    assert all({"timestamp", "level", "logger", "message", "span_id"} <= line.keys() for line in retrying)


async def test_a_timed_out_call_and_a_breaker_refusal_each_have_their_span(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "gateway.yaml",
        f"""
        mcps:
          child:
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, child]
            tool_timeouts: {{sleep: 0.5}}
        """,
    )
    timed_out, refused = "1" * 32, "2" * 32
    with OtlpReceiver().running() as receiver:
        env = gateway_tracing_env(receiver) | {
            "GATEWAY_RESILIENCE__BREAKER_FAILURES": "1",
            "GATEWAY_TRACING__CAPTURE_ARGUMENTS": "true",
        }
        process, url = start_gateway_http(config, tmp_path, env)
        try:
            with anyio.fail_after(60):
                async with Client(url, mode="legacy") as client:  # the handshake era: the span names the session
                    meta = {"traceparent": traceparent(timed_out, CLIENT_SPAN)}
                    assert (await client.call_tool("child__sleep", {"seconds": 5}, meta=meta)).is_error
                    meta = {"traceparent": traceparent(refused, CLIENT_SPAN)}
                    arguments = {"text": "x", "password": "hunter2"}
                    assert (await client.call_tool("child__echo", arguments, meta=meta)).is_error

                def complete(spans: list[ReceivedSpan]) -> bool:
                    return {timed_out, refused} <= {s.trace_id for s in spans if s.kind == "SERVER"}

                spans = await anyio.to_thread.run_sync(receiver.wait_for, complete, 30)
        finally:
            stop_process(process)

    for trace_id, code, layer in (
        (timed_out, "upstream_timeout", "gateway.timeout"),
        (refused, "circuit_open", "gateway.breaker"),
    ):
        server = one(spans, trace_id=trace_id, kind="SERVER")
        assert server.attributes["mcp_gateway.error.code"] == code and server.status == "ERROR"
        assert server.attributes["mcp.session.id"]
        attempt = one(spans, parent_id=server.span_id, name="gateway.attempt")
        assert attempt.status == "ERROR" and attempt.attributes["error.type"] == code
        span = one(spans, parent_id=attempt.span_id, name=layer)
        assert span.status == "ERROR" and span.attributes["error.type"] == code
    assert one(spans, trace_id=timed_out, name="gateway.timeout").attributes["mcp_gateway.timeout_seconds"] == 0.5
    # GATEWAY_TRACING__CAPTURE_ARGUMENTS: the arguments are on the span, redacted as the records redact them.
    captured = one(spans, trace_id=refused, kind="SERVER").attributes["gen_ai.tool.call.arguments"]
    assert json.loads(captured) == {"text": "x", "password": "***"}
    assert json.loads(one(spans, trace_id=timed_out, kind="SERVER").attributes["gen_ai.tool.call.arguments"]) == {
        "seconds": 5
    }
    assert one(spans, trace_id=refused, name="gateway.breaker").attributes["mcp_gateway.breaker.state"] == "open"


@pytest.mark.parametrize("upstream", ["child", "web"])
async def test_a_sampling_request_relayed_back_to_the_client_carries_the_calls_trace(
    tmp_path: Path, upstream: str
) -> None:
    seen: list[dict[str, Any]] = []

    async def sampling(context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        seen.append(dict(params.meta or {}))
        return types.CreateMessageResult(
            role="assistant", content=types.TextContent(type="text", text="42"), model="test-model"
        )

    with OtlpReceiver().running() as receiver, traced_upstream(receiver) as web_url:
        config = write_config(
            tmp_path / "gateway.yaml",
            f"""
            mcps:
              child:
                command: {sys.executable}
                args: ["{DEMO_SERVER}", stdio, --name, child]
              web:
                url: {web_url}
            """,
        )
        process, url = start_gateway_http(config, tmp_path, gateway_tracing_env(receiver))
        try:
            with anyio.fail_after(60):
                async with Client(url, mode="legacy", sampling_callback=sampling) as client:
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
                    tool = "child__ask_llm" if upstream == "child" else "web__ask"
                    result = await client.call_tool(tool, {"question": "6*7?"}, meta=meta)
                    assert not result.is_error, result
                [asked] = seen
                _, trace_id, span_id, _ = asked["traceparent"].split("-")
                assert trace_id == CLIENT_TRACE  # the client's own trace comes back with the question

                def arrived(spans: list[ReceivedSpan]) -> bool:
                    return any(s.span_id == span_id for s in spans)

                spans = await anyio.to_thread.run_sync(receiver.wait_for, arrived, 30)
        finally:
            stop_process(process)
    # ... as the child of the gateway's span that sent the question to the client.
    relayed = one(spans, span_id=span_id)
    assert relayed.service == "mcp-gateway" and relayed.kind == "CLIENT"
    assert relayed.name == "MCP send sampling/createMessage"


async def test_a_traceparent_header_continues_the_trace_under_stateless_http_in_both_eras(tmp_path: Path) -> None:
    config = child_config(tmp_path)
    with OtlpReceiver().running() as receiver:
        env = gateway_tracing_env(receiver) | {"GATEWAY_HTTP__STATELESS": "true"}
        process, url = start_gateway_http(config, tmp_path, env)
        try:
            with anyio.fail_after(30):
                for mode in ("auto", "legacy"):
                    header = {"traceparent": traceparent(HEADER_TRACE, HEADER_SPAN)}
                    async with create_mcp_http_client(headers=header) as http:
                        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
                            assert text_of(await client.call_tool("child__echo", {"text": mode})) == mode

                def complete(spans: list[ReceivedSpan]) -> bool:
                    calls = [s for s in spans if s.trace_id == HEADER_TRACE and s.name == "tools/call child__echo"]
                    return len(calls) == 2

                spans = await anyio.to_thread.run_sync(receiver.wait_for, complete, 30)
        finally:
            stop_process(process)
    calls = [s for s in spans if s.trace_id == HEADER_TRACE and s.name == "tools/call child__echo"]
    assert [s.parent_id for s in calls] == [HEADER_SPAN, HEADER_SPAN]


async def test_without_layer_spans_the_client_span_is_the_server_spans_child(tmp_path: Path) -> None:
    config = child_config(tmp_path)
    with OtlpReceiver().running() as receiver:
        env = gateway_tracing_env(receiver) | {"GATEWAY_TRACING__LAYER_SPANS": "false"}
        process, url = start_gateway_http(config, tmp_path, env)
        try:
            with anyio.fail_after(30):
                async with Client(url) as client:
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
                    assert text_of(await client.call_tool("child__echo", {"text": "x"}, meta=meta)) == "x"

                def complete(spans: list[ReceivedSpan]) -> bool:
                    return any(s.trace_id == CLIENT_TRACE and s.kind == "CLIENT" for s in spans)

                spans = await anyio.to_thread.run_sync(receiver.wait_for, complete, 30)
        finally:
            stop_process(process)
    server = one(spans, trace_id=CLIENT_TRACE, kind="SERVER")
    assert server.attributes["mcp_gateway.server.id"] == "child"  # the call's attributes are still there
    [child] = [s for s in spans if s.parent_id == server.span_id]
    assert child.kind == "CLIENT" and child.name == "MCP send tools/call echo"


async def test_spans_still_buffered_are_exported_when_the_gateway_stops(tmp_path: Path) -> None:
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    with OtlpReceiver().running() as receiver:
        env = gateway_tracing_env(receiver) | {"OTEL_BSP_SCHEDULE_DELAY": "600000"}  # no export before the stop
        process, url = start_gateway_http(config, tmp_path, env)
        try:
            with anyio.fail_after(30):
                async with Client(url) as client:
                    meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
                    await client.list_tools(meta=meta)
        finally:
            stop_process(process)  # SIGTERM: a clean shutdown
        assert process.returncode == 0
        spans = receiver.wait_for(lambda spans: bool(spans), 5)
    listed = one(spans, trace_id=CLIENT_TRACE, kind="SERVER")
    assert listed.name == "tools/list" and listed.parent_id == CLIENT_SPAN


async def test_the_console_exporter_writes_on_stderr_with_the_replica_and_leaves_stdio_to_the_protocol(
    tmp_path: Path,
) -> None:
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "--config", str(config), "serve", "--transport", "stdio"],
        env=gateway_env(tmp_path)
        | NO_EMBEDDINGS
        | {"GATEWAY_TRACING__ENABLED": "true", "OTEL_TRACES_EXPORTER": "console", "GATEWAY_REPLICA_ID": "r-7"},
        cwd=str(REPO),
    )
    stderr = tmp_path / "stderr.log"
    with anyio.fail_after(30), stderr.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
            await client.list_tools(meta=meta)
    printed = stderr.read_text()
    assert f"0x{CLIENT_TRACE}" in printed  # the span, as the console exporter prints it
    assert '"service.instance.id": "r-7"' in printed  # the replica, in the resource of every span


def test_tracing_off_loads_no_opentelemetry_sdk_or_exporter() -> None:
    code = (
        "import sys\n"
        "from gateway.config.runtime_settings import TracingSettings\n"
        "from gateway.observability.tracing import enabled, start_tracing\n"
        "import gateway.cli.serve, gateway.serving.http\n"
        "assert start_tracing(TracingSettings()) is None and not enabled()\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('opentelemetry.sdk', 'opentelemetry.exporter')))\n"
        "print(loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("variables", "hint"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER='zipkin' is not supported"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "pip install 'mcp-gateway[otel-grpc]'"),
    ],
)
def test_an_exporter_that_cannot_be_made_is_one_clear_error_before_serving(
    tmp_path: Path, variables: dict[str, str], hint: str
) -> None:
    config = write_config(tmp_path / "gateway.yaml", "mcps: {}\n")
    env = gateway_env(tmp_path) | {"GATEWAY_TRACING__ENABLED": "true"} | variables
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "--config", str(config), "serve", "--transport", "http", "--port", "0"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and hint in done.stderr


def test_tracing_without_the_otel_extra_names_the_extra_to_install(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "sys.modules['opentelemetry.sdk'] = None  # as if the otel extra were not installed\n"
        "from gateway.config.runtime_settings import TracingSettings\n"
        "from gateway.observability.tracing import TracingUnavailable, start_tracing\n"
        "try:\n"
        "    start_tracing(TracingSettings(enabled=True))\n"
        "except TracingUnavailable as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "GATEWAY_TRACING__ENABLED is true" in done.stdout
    assert "pip install 'mcp-gateway[otel]'" in done.stdout


async def test_with_tracing_off_the_sdks_request_span_runs_only_for_a_request_carrying_a_trace() -> None:
    """In process (no tracer provider): the SDK's middleware, wrapped, still makes a client's `traceparent`
    current (JSON logs and upstream requests carry it); a request without one skips it."""
    from mcp.server.lowlevel.server import Server

    from gateway.observability.tracing import RequestSpans, current_ids, skip_idle_request_spans

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        ids = current_ids()
        return types.CallToolResult(content=[types.TextContent(type="text", text=json.dumps(ids))])

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="t", input_schema={"type": "object"})])

    server = Server("traced", on_call_tool=call_tool, on_list_tools=list_tools)
    skip_idle_request_spans(server.middleware)
    assert [type(layer) for layer in server.middleware] == [RequestSpans]
    async with Client(server) as client:
        meta = {"traceparent": traceparent(CLIENT_TRACE, CLIENT_SPAN)}
        traced = json.loads(text_of(await client.call_tool("t", {}, meta=meta)))
        untraced = json.loads(text_of(await client.call_tool("t", {})))
    assert traced == [CLIENT_TRACE, CLIENT_SPAN]
    assert untraced is None
