"""Security overhead: what authentication, the HTTP guard and description scanning cost.

    python bench/security_overhead.py              # figures on stdout
    python bench/security_overhead.py --json       # and one JSON object as the last line

Measured in one process, interleaved in rounds so machine load affects every variant alike:

1. `Authenticator.authenticate` of a valid API key with 1, 10 and 100 configured keys
   (every stored hash is compared, so the cost grows with the number of keys), and of
   an RS256 JWT against a JWKS file;
2. one HTTP request through `SecurityMiddleware` (Host/Origin, bearer key, rate limit,
   body limit) in front of a trivial ASGI app, against the same app with no middleware
   (both through httpx's in-process ASGI transport, so no socket time is included);
3. `injection.scan` of one tool description (the 527 descriptions of the LiveMCPBench
   catalog, each scanned against the other servers' tool names);
4. `ToolVetter.vet` of that whole catalog, as done at every catalog rebuild: the first
   time (every fingerprint written to a new store, every description scanned) and
   again (fingerprints compared, scans remembered), `--vets` times each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx2  # noqa: E402
import jwt  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings  # noqa: E402
from timing import timed  # noqa: E402

from gateway.catalog import ServerListing  # noqa: E402
from gateway.config.security import AuthConfig, SecurityConfig  # noqa: E402
from gateway.router.eval import load_catalog  # noqa: E402
from gateway.security.auth import Authenticator, hash_key, new_key  # noqa: E402
from gateway.security.http_guard import SecurityMiddleware  # noqa: E402
from gateway.security.injection import scan  # noqa: E402
from gateway.security.integrity import IntegrityStore  # noqa: E402
from gateway.security.vetting import ToolVetter  # noqa: E402

logging.getLogger("gateway.security.vetting").setLevel(logging.ERROR)  # findings on the real catalog are not news here


def key_auth(n: int) -> tuple[Authenticator, str]:
    keys = [new_key() for _ in range(n)]
    config = AuthConfig.model_validate(
        {"api_keys": [{"name": f"k{i}", "hash": hash_key(k)} for i, k in enumerate(keys)]}
    )
    return Authenticator(config), keys[-1]


def jwt_auth(directory: Path) -> tuple[Authenticator, str]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    (directory / "jwks.json").write_text(json.dumps({"keys": [{**public, "kid": "k"}]}))
    config = AuthConfig.model_validate(
        {
            "jwt": {"jwks_file": str(directory / "jwks.json"), "issuer": "https://id", "audience": "gw"},
            "profiles": {"p": {}},
        }
    )
    now = int(time.time())
    claims = {"iss": "https://id", "aud": "gw", "sub": "s", "exp": now + 3600, "gateway_profile": "p"}
    return Authenticator(config), jwt.encode(claims, private, algorithm="RS256", headers={"kid": "k"})


async def app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def descriptions(catalog: Path) -> list[tuple[str, list[str]]]:
    """Each tool's description, with the names (own and exposed) of other servers' tools."""
    records = load_catalog(catalog)
    return [
        (
            r.tool.description or "",
            [n for o in records if o.server_id != r.server_id for n in (o.name, o.original_name)],
        )
        for r in records
    ]


async def main(calls: int, rounds: int, catalog: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        authenticators = {f"API key, {n} keys": key_auth(n) for n in (1, 10, 100)}
        authenticators["JWT RS256 (JWKS file)"] = jwt_auth(Path(tmp))
    guard_key = new_key()
    auth = AuthConfig.model_validate(
        {"api_keys": [{"name": "b", "hash": hash_key(guard_key)}], "rate_limit": {"per_minute": 1e9, "burst": 10**9}}
    )
    security = TransportSecuritySettings(allowed_hosts=["127.0.0.1:*"], allowed_origins=["http://127.0.0.1:*"])
    guard = SecurityMiddleware(
        app,
        guard=TransportSecurityMiddleware(security),
        auth=auth,
        endpoint_path="/mcp",
        max_body=4 * 1024 * 1024,
        authenticator=Authenticator(auth),
    )
    headers = {"Authorization": f"Bearer {guard_key}", "Content-Type": "application/json"}
    bare = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://127.0.0.1:8765")
    guarded = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=guard), base_url="http://127.0.0.1:8765")
    variants: dict[str, Callable[[], Awaitable[Any]]] = {
        name: (lambda a=auth, t=token: a.authenticate(t)) for name, (auth, token) in authenticators.items()
    }
    variants["HTTP request, no middleware"] = lambda: bare.post("/mcp", content=b"{}", headers=headers)
    variants["HTTP request, SecurityMiddleware"] = lambda: guarded.post("/mcp", content=b"{}", headers=headers)
    texts = descriptions(catalog)

    async def scan_one(index: list[int] = [0]) -> None:  # noqa: B006 - a cursor over the catalog
        text, others = texts[index[0] % len(texts)]
        index[0] += 1
        scan(text, others)

    variants["injection.scan, one description"] = scan_one
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for work in variants.values():  # warm-up
        await timed(work, max(10, calls // 10))
    for round_ in range(rounds):
        order = list(variants)[round_ % len(variants) :] + list(variants)[: round_ % len(variants)]
        for name in order:
            samples[name] += await timed(variants[name], calls // rounds)
    await bare.aclose()
    await guarded.aclose()
    return {
        name: {"median_us": statistics.median(s), "p95_us": sorted(s)[int(len(s) * 0.95)]}
        for name, s in samples.items()
    }


def vet_timings(catalog: Path, vets: int) -> dict[str, Any]:
    """Milliseconds to vet the whole catalog: on a new store, then once known."""
    servers: dict[str, list[Any]] = {}
    for record in load_catalog(catalog):
        servers.setdefault(record.server_id, []).append(record.tool.model_copy(update={"name": record.original_name}))
    listings = [ServerListing(server_id=s, prefix=s[:32], tools=tools) for s, tools in servers.items()]
    first, again = [], []
    for _ in range(vets):
        with tempfile.TemporaryDirectory() as tmp:
            vetter = ToolVetter(IntegrityStore.in_dir(Path(tmp)), SecurityConfig())
            started = time.perf_counter()
            vetter.vet(listings)
            first.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            vetter.vet(listings)
            again.append((time.perf_counter() - started) * 1000)
    tools = sum(len(listing.tools) for listing in listings)
    return {"tools": tools, "first_ms": statistics.median(first), "again_ms": statistics.median(again)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="measured calls per variant (default 2000)")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved rounds (default 20)")
    parser.add_argument("--catalog", type=Path, default=Path("../shared/eval/livemcpbench/catalog.json"))
    parser.add_argument("--vets", type=int, default=5, help="whole-catalog vetting runs (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args()
    results = asyncio.run(main(args.calls, args.rounds, args.catalog))
    baseline = results["HTTP request, no middleware"]["median_us"]
    print(f"{'variant':40} {'median µs':>10} {'p95 µs':>10}")
    for name, figures in results.items():
        print(f"{name:40} {figures['median_us']:10.1f} {figures['p95_us']:10.1f}")
    guarded = results["HTTP request, SecurityMiddleware"]["median_us"]
    print(f"\nSecurityMiddleware: +{guarded - baseline:.1f} µs per request ({guarded / baseline:.2f}x the bare app)")
    vetting = vet_timings(args.catalog, args.vets)
    print(
        f"ToolVetter.vet of {vetting['tools']} tools: {vetting['first_ms']:.0f} ms on a new store, "
        f"{vetting['again_ms']:.1f} ms once known (medians of {args.vets})"
    )
    if args.json:
        print(json.dumps({**results, "vetting": vetting}))
