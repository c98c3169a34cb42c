"""A real OpenAI-compatible embeddings server for the tests: `POST /v1/embeddings` with the bundled model.

    python tests/servers/embeddings_server.py --data-dir DIR [--port N] [--model NAME] [--key KEY]

Prints `PORT=<n>` once listening on 127.0.0.1. Answers as OpenAI does
(`{"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...]}], "model": ...}`),
401 without the right bearer key when `--key` is given, and 404 for another model name. It counts
the texts it embedded (`GET /stats`), so a test can tell what went over the wire.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gateway.config.routing_settings import EmbeddingSettings
from gateway.router.model_loading import load_embedder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--key", default=None)
    args = parser.parse_args()
    embedder = load_embedder(EmbeddingSettings(document_workers=1, threads=1), args.data_dir)
    if embedder is None:
        sys.exit("the bundled model did not load")
    lock = threading.Lock()
    counts = {"requests": 0, "texts": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/stats":
                self._answer(200, counts)
            else:
                self._answer(404, {"error": {"message": "not found"}})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
            if self.path != "/v1/embeddings":
                self._answer(404, {"error": {"message": f"no route {self.path}"}})
                return
            if args.key is not None and self.headers.get("authorization") != f"Bearer {args.key}":
                self._answer(401, {"error": {"message": "Incorrect API key provided"}})
                return
            if body.get("model") != args.model:
                self._answer(404, {"error": {"message": f"model {body.get('model')!r} not found"}})
                return
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            with lock:  # one model session: requests take turns, as a small server's queue would
                vectors = embedder.embed_documents(texts)
                counts["requests"] += 1
                counts["texts"] += len(texts)
            data = [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
            usage = {"prompt_tokens": 0, "total_tokens": 0}
            self._answer(200, {"object": "list", "data": data, "model": args.model, "usage": usage})

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"PORT={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
