"""The router on an OpenAI-compatible embeddings endpoint against the same model in process (issue 30).

    python bench/router_endpoint.py --set ../shared/eval/livemcpbench --set ../shared/eval/metatool [--json]

For each set, in one process and one run: the router with the bundled model in process, the router
with the same model behind `POST /v1/embeddings` (`tests/servers/embeddings_server.py`, a child
process on 127.0.0.1, one request at a time), and BM25 alone (what the router falls back to while an
endpoint is down). Printed: recall@1/5/10, MRR, the search p50 (query embedding included: one HTTP
round trip for the endpoint), the index build time, and the endpoint/in-process ratios of both times.
No embedding cache: every document is embedded by the backend measured.

`--pairs N`: N query embeddings through each backend, interleaved one by one (the machine is shared:
only same-moment comparisons mean much), with the medians and their difference, the HTTP round trip.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from gateway.config.routing_settings import EmbeddingSettings  # noqa: E402
from gateway.router.base import Embedder  # noqa: E402
from gateway.router.eval import EvalReport, evaluate  # noqa: E402
from gateway.router.eval_sets import load_set  # noqa: E402
from gateway.router.model_loading import load_embedder  # noqa: E402
from gateway.router.remote_embedder import EndpointEmbedder  # noqa: E402

KS = (1, 5, 10)


def start_server(data_dir: Path) -> tuple[subprocess.Popen[str], str]:
    server = REPO / "tests" / "servers" / "embeddings_server.py"
    process = subprocess.Popen(
        [sys.executable, str(server), "--data-dir", str(data_dir), "--model", "all-minilm-l6-v2"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # PORT=<n>, once the model is loaded and the socket listens
    if not line.startswith("PORT="):
        process.kill()
        raise SystemExit(f"the embeddings server did not start: {line!r}")
    return process, f"http://127.0.0.1:{line.strip().removeprefix('PORT=')}/v1"


def row(name: str, report: EvalReport) -> dict[str, float | str]:
    out: dict[str, float | str] = {"backend": name}
    out.update({f"r@{k}": round(report.recall[k], 3) for k in KS})
    out.update(
        mrr=round(report.mrr, 3),
        search_p50_ms=round(report.search_ms_p50, 2),
        index_s=round(report.index_seconds + report.enrich_seconds, 2),
    )
    return out


def pairs(local: Embedder, remote: Embedder, count: int) -> dict[str, float | str]:
    """Median ms of one query embedding in process and through the endpoint, interleaved."""
    texts = [f"find the weather forecast for city number {i}" for i in range(count)]
    times: dict[str, list[float]] = {"in-process": [], "endpoint": []}
    for i, text in enumerate(texts):
        order = [("in-process", local), ("endpoint", remote)]
        for name, embedder in order if i % 2 else order[::-1]:
            started = time.perf_counter()
            embedder.embed_query(text)
            times[name].append((time.perf_counter() - started) * 1000)
    local_ms, remote_ms = statistics.median(times["in-process"]), statistics.median(times["endpoint"])
    print(
        f"query embedding, {count} interleaved pairs: in-process p50 {local_ms:.2f} ms, endpoint p50 "
        f"{remote_ms:.2f} ms (x{remote_ms / local_ms:.2f}, +{remote_ms - local_ms:.2f} ms)",
        flush=True,
    )
    return {"backend": "pairs", "in_process_p50_ms": round(local_ms, 2), "endpoint_p50_ms": round(remote_ms, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", type=Path, action="append", default=[], dest="sets", metavar="DIR")
    parser.add_argument("--pairs", type=int, default=0, help="interleaved query embeddings per backend")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, list[dict[str, float | str]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        local = load_embedder(EmbeddingSettings(), data_dir)
        assert local is not None
        process, url = start_server(data_dir)
        try:
            remote = EndpointEmbedder(url, "all-minilm-l6-v2", query_timeout=30)
            if args.pairs:
                results["pairs"] = [pairs(local, remote, args.pairs)]
            for folder in args.sets:
                dev = load_set(folder / "catalog.json", folder / "queries.jsonl")
                rows = [
                    row("in-process", evaluate(dev.records, dev.queries, KS, local)),
                    row("endpoint", evaluate(dev.records, dev.queries, KS, remote)),
                    row("bm25 (fallback)", evaluate(dev.records, dev.queries, KS, None)),
                ]
                results[dev.name] = rows
                print(f"{dev.name}: {len(dev.records)} tools, {len(dev.queries)} queries")
                for r in rows:
                    print("  " + "  ".join(f"{key}={value}" for key, value in r.items()))
                base, other = rows[0], rows[1]
                search = float(other["search_p50_ms"]) / float(base["search_p50_ms"])
                index = float(other["index_s"]) / float(base["index_s"])
                print(f"  endpoint/in-process: search p50 x{search:.2f}, index x{index:.2f}", flush=True)
        finally:
            process.kill()
            process.wait(10)
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
