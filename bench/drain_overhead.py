"""What the drain layer and the reachability check cost one HTTP request.

    python bench/drain_overhead.py              # figures on stdout
    python bench/drain_overhead.py --json       # and one JSON object as the last line

Four ASGI stacks around the same trivial app, each request one direct ASGI call with a prepared
scope (no socket, no HTTP client: the layers' own time), interleaved in rounds so machine load
affects every variant alike:
the bare app; `Drain(app)` (`gateway.serving.drain`, on every request of a serving gateway); the
HTTP guard of a gateway without `auth:` (Host/Origin, body limit) without and with its
`loopback_only` check (`gateway.security.reachability`). Medians of per-round means, and each
one's extra time over its baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings  # noqa: E402

from gateway.config.security import AuthConfig  # noqa: E402
from gateway.security.http_guard import SecurityMiddleware  # noqa: E402
from gateway.security.reachability import no_auth_refusal  # noqa: E402
from gateway.serving.drain import Drain  # noqa: E402


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def guard(loopback_only: bool) -> SecurityMiddleware:
    security = TransportSecuritySettings(allowed_hosts=["127.0.0.1:*"], allowed_origins=["http://127.0.0.1:*"])
    return SecurityMiddleware(
        app,
        guard=TransportSecurityMiddleware(security),
        auth=AuthConfig(),
        endpoint_path="/mcp",
        max_body=4 * 1024 * 1024,
        loopback_only=(lambda why: no_auth_refusal(why, Path("gateway.yaml"))) if loopback_only else None,
    )


SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "POST",
    "scheme": "http",
    "path": "/mcp",
    "raw_path": b"/mcp",
    "root_path": "",
    "query_string": b"",
    "headers": [
        (b"host", b"127.0.0.1:8765"),
        (b"content-type", b"application/json"),
        (b"accept", b"application/json, text/event-stream"),
        (b"content-length", b"2"),
        (b"user-agent", b"bench"),
    ],
    "client": ("127.0.0.1", 50000),
    "server": ("127.0.0.1", 8765),
}


async def receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def send(message: dict[str, Any]) -> None:
    if message["type"] == "http.response.start":
        assert message["status"] == 200, message


async def main(calls: int, rounds: int) -> dict[str, Any]:
    stacks: dict[str, Any] = {
        "bare app": app,
        "Drain(app)": Drain(app),
        "guard, no auth": guard(False),
        "guard, no auth, loopback_only": guard(True),
    }
    variants: dict[str, Callable[[], Awaitable[Any]]] = {
        name: (lambda s=stack: s(dict(SCOPE), receive, send)) for name, stack in stacks.items()
    }
    for variant in variants.values():  # warm up
        for _ in range(200):
            await variant()
    means: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(rounds):
        for name, variant in variants.items():
            started = time.perf_counter()
            for _ in range(calls):
                await variant()
            means[name].append((time.perf_counter() - started) / calls * 1e6)
    medians = {name: statistics.median(values) for name, values in means.items()}
    extra = {
        "Drain(app)": medians["Drain(app)"] - medians["bare app"],
        "loopback_only": medians["guard, no auth, loopback_only"] - medians["guard, no auth"],
    }
    return {"calls": calls, "rounds": rounds, "median_us": medians, "extra_us": extra}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="requests per variant and round")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.calls, args.rounds))
    for name, value in result["median_us"].items():
        print(f"{name:32s} {value:8.1f} us/request")
    for name, value in result["extra_us"].items():
        print(f"extra for {name:22s} {value:+8.1f} us/request")
    if args.json:
        print(json.dumps(result))
