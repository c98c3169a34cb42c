"""Graceful drain of a real gateway process on SIGTERM (`gateway.serving.drain`).

A gateway serves the demo server over stdio; a tool call that takes a while is in flight when
the gateway gets SIGTERM. Readiness goes false at once, new requests are refused while that
call runs, the call finishes with its result, and then the process exits 0. A call that outlasts
the drain time does not keep the process: it stops when the drain time is over.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.conftest import DEMO_SERVER, NO_EMBEDDINGS, start_gateway_http, write_config

pytestmark = pytest.mark.anyio

HEADERS = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-06-18",
}


async def _call(http: httpx2.AsyncClient, name: str, **arguments: Any) -> httpx2.Response:
    """A `tools/call` POSTed on its own, as a stateless client sends it."""
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    return await http.post("/mcp", json=body, headers=HEADERS)


@contextmanager
def _gateway(tmp_path: Path, **env: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    config = write_config(
        tmp_path / "gateway.yaml",
        f'mcps:\n  slow: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, slow]}}\n',
    )
    settings = NO_EMBEDDINGS | {"GATEWAY_HTTP__STATELESS": "true", "GATEWAY_RECORDS__ENABLED": "false"} | env
    process, url = start_gateway_http(config, tmp_path, settings)
    try:
        yield process, url.removesuffix("/mcp")
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


async def _until_started(marker: Path) -> None:
    while not (marker.exists() and marker.read_text()):  # the upstream runs the call
        await anyio.sleep(0.05)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
async def test_on_sigterm_readiness_goes_false_new_requests_are_refused_and_the_call_in_flight_finishes(
    tmp_path: Path, loop: str
) -> None:
    marker = tmp_path / "marker"
    with _gateway(tmp_path, GATEWAY_HTTP__DRAIN_NOTICE_SECONDS="0.5", GATEWAY_HTTP__EVENT_LOOP=loop) as (process, base):
        result: dict[str, Any] = {}
        async with httpx2.AsyncClient(base_url=base, timeout=120) as kept, anyio.create_task_group() as tg:
            assert (await kept.get("/healthz")).status_code == 200  # a kept-alive connection, opened before

            async def slow_call() -> None:
                async with httpx2.AsyncClient(base_url=base, timeout=120) as http:
                    answer = await _call(http, "slow__slow_lookup", seconds=8, marker=str(marker))
                result["status"], result["body"] = answer.status_code, answer.json()

            tg.start_soon(slow_call)
            with anyio.fail_after(60):
                await _until_started(marker)
            process.send_signal(signal.SIGTERM)
            with anyio.fail_after(60):
                ready = await kept.get("/readyz")
                while ready.status_code == 200:  # until the signal is handled: then readiness goes first
                    await anyio.sleep(0.05)
                    ready = await kept.get("/readyz")
                assert ready.status_code == 503 and ready.json()["draining"] is True
                refused: str | None = None
                while refused is None:  # after the notice: a new connection is refused ...
                    try:
                        async with httpx2.AsyncClient(base_url=base, timeout=10) as fresh:
                            answer = await _call(fresh, "slow__add", a=1, b=2)
                        if answer.status_code == 503:
                            refused = answer.json()["error"]
                    except httpx2.ConnectError:
                        refused = "connection refused"
                    except (httpx2.ReadError, httpx2.RemoteProtocolError):
                        # connected into the backlog as the listener closed (uvloop closes it a loop turn
                        # later): reset before any answer, the request never reached the gateway
                        refused = "connection reset"
                    else:
                        await anyio.sleep(0.05)
            assert "status" not in result, "the call in flight was still running when new requests were refused"
            assert process.poll() is None
        # ... the call in flight finished with its result, and then the process exited.
        assert result["status"] == 200, result
        assert result["body"]["result"]["content"][0]["text"] == "looked up in 8.0"
        assert process.wait(timeout=60) == 0


async def test_a_call_that_outlasts_the_drain_time_does_not_keep_the_gateway(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    with _gateway(tmp_path, GATEWAY_HTTP__DRAIN_SECONDS="1") as (process, base):
        async with anyio.create_task_group() as tg:

            async def endless_call() -> None:
                async with httpx2.AsyncClient(base_url=base, timeout=120) as http:
                    try:
                        await _call(http, "slow__wait_for_cancel", marker=str(marker))
                    except httpx2.HTTPError:
                        pass  # cut when the drain time is over: the point of this test

            tg.start_soon(endless_call)
            with anyio.fail_after(60):
                while not Path(f"{marker}.started").exists():
                    await anyio.sleep(0.05)
            process.send_signal(signal.SIGTERM)
            # The call would take 60 s; the gateway stops after its 1 s of drain time (and uvicorn's 5 s).
            assert await anyio.to_thread.run_sync(lambda: process.wait(timeout=45)) == 0
