"""A real OTLP/HTTP trace receiver on 127.0.0.1 for the tests: `POST /v1/traces` with an
`ExportTraceServiceRequest` (protobuf, optionally gzip), decoded with `opentelemetry-proto`.

No Collector or Jaeger ships in a package registry this project can use, so the tests run this
one; it answers as a collector does (200 with an empty `ExportTraceServiceResponse`).
`GET /count` answers how many spans it got, by service, as JSON.

`python tests/otlp_receiver.py` runs one in its own process (the tracing benchmark's collector),
printing `PORT=<n>` once it listens, until it is terminated.
"""

from __future__ import annotations

import gzip
import json
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KIND_NAMES = {0: "UNSPECIFIED", 1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    """"" for a root span."""
    name: str
    kind: str
    status: str
    status_message: str
    attributes: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        name=span.name,
                        kind=KIND_NAMES.get(span.kind, str(span.kind)),
                        status=STATUS_NAMES.get(span.status.code, str(span.status.code)),
                        status_message=span.status.message,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                    )
                )
    return spans


class OtlpReceiver:
    """Keeps every span it receives; `wait_for` blocks (bounded) until a condition on them holds."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (the name http.server calls)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path.rstrip("/") != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._changed:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                    receiver._changed.notify_all()
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def do_GET(self) -> None:  # noqa: N802
                with receiver._changed:
                    counts: dict[str, int] = {}
                    for span in receiver.spans:
                        counts[span.service] = counts.get(span.service, 0) + 1
                reply = json.dumps({"spans": counts, "requests": receiver.requests}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"

    def wait_for(self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float) -> list[ReceivedSpan]:
        """The spans once `condition(spans)` holds; AssertionError with what arrived after `timeout` seconds."""
        with self._changed:
            if not self._changed.wait_for(lambda: condition(self.spans), timeout):
                names = [(s.service, s.name) for s in self.spans]
                raise AssertionError(f"the receiver did not get the spans within {timeout}s; it got {names}")
            return list(self.spans)

    @contextmanager
    def running(self) -> Iterator[OtlpReceiver]:
        thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=5)


def main() -> None:
    receiver = OtlpReceiver()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(f"PORT={receiver.endpoint.rsplit(':', 1)[1]}", flush=True)
    try:
        receiver._server.serve_forever(poll_interval=0.05)
    finally:
        receiver._server.server_close()


if __name__ == "__main__":
    main()
