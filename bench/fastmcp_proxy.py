"""FastMCP's proxy in front of one upstream: the third path of `bench/load.py`.

    python bench/fastmcp_proxy.py http --url UPSTREAM_URL [--fresh] [--sse]   # prints PORT=<n> once listening
    python bench/fastmcp_proxy.py stdio [--fresh] -- COMMAND ARG...    # serves MCP on stdin/stdout

The proxy is `fastmcp.server.create_proxy(client)` (FastMCP 4.x, the `bench` extra). By
default `client` is connected before the proxy serves, so FastMCP reuses that one upstream
session for every request (its fast mode); `--fresh` hands it a disconnected client, and
FastMCP opens a new upstream session per request (its default for a URL or command target).

Over HTTP it listens on 127.0.0.1 on a free port through a socket bound here with
`IPPROTO_TCP`, so asyncio sets TCP_NODELAY on the connections it accepts, as uvicorn does
when it binds the port itself.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from typing import Any

from fastmcp import Client
from fastmcp.client.transports import SSETransport, StdioTransport, StreamableHttpTransport
from fastmcp.server import create_proxy


async def _serve(args: argparse.Namespace, client: Client[Any]) -> None:
    proxy = create_proxy(client, name="fastmcp-proxy")
    if args.transport == "stdio":
        await proxy.run_async("stdio", show_banner=False, log_level="WARNING")
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    print(f"PORT={sock.getsockname()[1]}", flush=True)
    await proxy.run_http_async(
        show_banner=False, host="127.0.0.1", path="/mcp", log_level="WARNING", sockets=[sock], stateless_http=False
    )


async def _main(args: argparse.Namespace) -> None:
    if args.transport == "http":
        transport = SSETransport(args.url) if args.sse else StreamableHttpTransport(args.url)
        client: Client[Any] = Client(transport)
    else:
        if not args.command:
            raise SystemExit("stdio: give the upstream's command after --")
        client = Client(StdioTransport(command=args.command[0], args=args.command[1:]))
    if args.fresh:
        await _serve(args, client)
        return
    async with client:
        await _serve(args, client)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("transport", choices=["http", "stdio"])
    parser.add_argument("--url", help="the upstream's streamable HTTP URL (transport http)")
    parser.add_argument("--fresh", action="store_true", help="a new upstream session per request (FastMCP's default)")
    parser.add_argument("--sse", action="store_true", help="the upstream speaks the legacy HTTP+SSE transport")
    parser.epilog = "transport stdio: the upstream's command follows --"
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.command = argv[split + 1 :]
    if args.transport == "http" and not args.url:
        parser.error("http: --url is required")
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
