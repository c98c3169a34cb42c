"""The smallest real MCP server: handshake-era JSON-RPC over stdio, standard library only.

It starts in milliseconds (the demo server imports the SDK, which takes most of a
second), so tests can kill and restart it a hundred times. `--grandchild PIDFILE`
first starts a child of its own, as `npx`/`uvx` wrappers do, and appends both pids.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

TOOL = {
    "name": "echo",
    "description": "Echo the text back.",
    "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}


def answer(request: dict) -> dict:
    method, params = request.get("method"), request.get("params") or {}
    if method == "initialize":
        return {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [TOOL]}
    if method == "tools/call":
        text = (params.get("arguments") or {}).get("text", "")
        return {"content": [{"type": "text", "text": text}], "isError": False}
    if method == "ping":
        return {}
    raise LookupError(method)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--grandchild":
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(sys.argv[2], "a") as f:
            f.write(f"{os.getpid()} {child.pid}\n")
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue  # a notification
        try:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": answer(message)}
        except LookupError:
            error = {"code": -32601, "message": f"Method not found: {message.get('method')}"}
            reply = {"jsonrpc": "2.0", "id": message["id"], "error": error}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
