"""Serve an ASGI app on 127.0.0.1 and print `PORT=<n>` once it listens (what tests wait for).

Shared by the test server scripts; they run as `python tests/servers/<script>.py`, which
puts this folder on `sys.path`, so they import it as `http_runner`.
"""

from __future__ import annotations

import sys
from typing import Any

import anyio


def serve_http(app: Any, port: int = 0) -> None:
    """Run `app` with uvicorn until stopped; print the port it got on stdout.

    On SIGTERM, streams still open (a gateway's `subscriptions/listen`) are cut after 1 s:
    uvicorn would otherwise wait for them without end, until the test kills the server.
    """
    import uvicorn

    # h11, not uvicorn's `auto` (httptools, now that the gateway depends on it): the trivial upstream stays
    # the yardstick `bench/load.py` measured the gateway's CPU per call against before
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1, http="h11"
    )
    server = uvicorn.Server(config)

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve)
            while not server.started:
                await anyio.sleep(0.01)
            print(f"PORT={server.servers[0].sockets[0].getsockname()[1]}", flush=True)

    anyio.run(serve)
    sys.exit(0)
