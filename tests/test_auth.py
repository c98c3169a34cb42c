"""Authentication (`gateway.security.auth`), rate limits (`gateway.security.ratelimit`) and the `auth:` section."""

from __future__ import annotations

import functools
import http.server
import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa

from gateway.cli.main import run
from gateway.config.loader import ConfigError, parse_config
from gateway.config.security import AuthConfig, RateLimit
from gateway.security.auth import Authenticator, AuthError, hash_key, new_key
from gateway.security.ratelimit import RateLimiter

pytestmark = pytest.mark.anyio

ISSUER = "https://id.example.com/"
AUDIENCE = "https://gateway.example.com/mcp"


def test_a_new_key_is_long_random_and_hashes_to_the_stored_form() -> None:
    key = new_key()
    assert key.startswith("mgw_") and len(key) >= 40 and key != new_key()
    assert hash_key(key).startswith("sha256:") and len(hash_key(key)) == 7 + 64


def test_keys_new_and_keys_hash_agree(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["keys", "new"]) == 0
    out = capsys.readouterr().out.splitlines()
    key, digest = out[0].split()[1], out[1].split()[1]
    assert run(["keys", "hash", key]) == 0
    assert capsys.readouterr().out.strip() == digest == hash_key(key)


async def test_keys_authenticate_by_hash_with_their_profile_and_rate() -> None:
    keys = {name: new_key() for name in ("a", "b")}
    config = AuthConfig.model_validate(
        {
            "api_keys": [
                {"name": "a", "hash": hash_key(keys["a"])},
                {"name": "b", "hash": hash_key(keys["b"]), "profile": "p"},
            ],
            "profiles": {"p": {"servers": ["x"], "rate_limit": {"per_minute": 5, "burst": 1}}},
        }
    )
    auth = Authenticator(config)
    a, b = await auth.authenticate(keys["a"]), await auth.authenticate(keys["b"])
    assert (a.name, a.profile, a.rate_limit) == ("a", None, config.rate_limit)
    assert b.profile is not None and b.profile.servers == ["x"] and b.rate_limit == RateLimit(per_minute=5, burst=1)
    for wrong in (new_key(), keys["a"][:-1], "", "\udcff"):
        with pytest.raises(AuthError, match="invalid API key"):
            await auth.authenticate(wrong)


@pytest.fixture
def jwks(tmp_path: Path) -> tuple[Any, Path]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig", "alg": "RS256"}]}))
    return private, path


def token(private: Any, **claims: Any) -> str:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "ada", "exp": now + 300, "iat": now, **claims}
    return jwt.encode(
        {k: v for k, v in body.items() if v is not None}, private, algorithm="RS256", headers={"kid": "k1"}
    )


def jwt_auth(path: Path, **jwt_config: Any) -> Authenticator:
    config = {"jwks_file": str(path), "issuer": ISSUER, "audience": AUDIENCE, **jwt_config}
    return Authenticator(AuthConfig.model_validate({"jwt": config, "profiles": {"ro": {"servers": ["clock"]}}}))


async def test_a_jwt_is_verified_against_the_jwks_issuer_and_audience(jwks: tuple[Any, Path]) -> None:
    private, path = jwks
    auth = jwt_auth(path)
    principal = await auth.authenticate(token(private, gateway_profile="ro"))
    assert principal.name == "jwt:ada" and principal.profile is not None and principal.profile.servers == ["clock"]
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    for bad in (
        token(private, gateway_profile="ro", aud="https://elsewhere.example.com"),
        token(private, gateway_profile="ro", iss="https://evil.example.com/"),
        token(private, gateway_profile="ro", exp=int(time.time()) - 3600),
        token(private, gateway_profile="ro", exp=None),
        token(other, gateway_profile="ro"),
        token(private, gateway_profile="ro")[:-4] + "AAAA",
    ):
        with pytest.raises(AuthError, match="invalid token") as refused:
            await auth.authenticate(bad)
        assert refused.value.status == 401


async def test_a_jwt_without_a_known_profile_is_forbidden(jwks: tuple[Any, Path]) -> None:
    private, path = jwks
    with pytest.raises(AuthError) as refused:
        await jwt_auth(path).authenticate(token(private))
    assert refused.value.status == 403
    with pytest.raises(AuthError):
        await jwt_auth(path).authenticate(token(private, gateway_profile="admin"))
    principal = await jwt_auth(path, default_profile="ro").authenticate(token(private))
    assert principal.profile is not None


async def test_a_key_or_a_jwt_is_an_admin_only_when_configured_so(jwks: tuple[Any, Path]) -> None:
    keys = {name: new_key() for name in ("root", "agent")}
    config = AuthConfig.model_validate(
        {
            "api_keys": [
                {"name": "root", "hash": hash_key(keys["root"]), "admin": True},
                {"name": "agent", "hash": hash_key(keys["agent"])},
            ]
        }
    )
    auth = Authenticator(config)
    assert (await auth.authenticate(keys["root"])).admin and not (await auth.authenticate(keys["agent"])).admin
    private, path = jwks
    by_claim = jwt_auth(path, default_profile="ro")
    assert (await by_claim.authenticate(token(private, gateway_admin=True))).admin
    for not_admin in ("true", 1, None, False):
        assert not (await by_claim.authenticate(token(private, gateway_admin=not_admin))).admin
    renamed = jwt_auth(path, default_profile="ro", admin_claim="ops")
    assert (await renamed.authenticate(token(private, ops=True))).admin
    assert not (await renamed.authenticate(token(private, gateway_admin=True))).admin


async def test_a_jwt_is_verified_against_a_jwks_url(jwks: tuple[Any, Path]) -> None:
    private, path = jwks
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(path.parent))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            url = f"http://127.0.0.1:{server.server_address[1]}/{path.name}"
            config = {"jwks_url": url, "issuer": ISSUER, "audience": AUDIENCE, "default_profile": "ro"}
            auth = Authenticator(AuthConfig.model_validate({"jwt": config, "profiles": {"ro": {}}}))
            with anyio.fail_after(20):
                assert (await auth.authenticate(token(private))).name == "jwt:ada"
                with pytest.raises(AuthError, match="invalid token"):
                    await auth.authenticate(token(private, aud="https://elsewhere.example.com"))
        finally:
            server.shutdown()


def test_an_unreadable_jwks_file_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "jwks.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read the JWKS file"):
        jwt_auth(tmp_path / "jwks.json")


def test_a_token_bucket_allows_a_burst_then_the_rate() -> None:
    now = [0.0]
    limiter = RateLimiter(clock=lambda: now[0])
    limit = RateLimit(per_minute=60, burst=2)
    assert [limiter.check("k", limit) for _ in range(3)] == [0, 0, 1]
    now[0] = 1.0
    assert limiter.check("k", limit) == 0 and limiter.check("k", limit) == 1
    assert limiter.check("other", limit) == 0  # buckets are per caller
    slow = RateLimit(per_minute=1, burst=1)
    assert limiter.check("s", slow) == 0 and limiter.check("s", slow) == 60


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("auth:\n  api_keys:\n    - name: a\n      hash: nope\n", "gw.yaml:4: auth.api_keys[0].hash: must be sha256"),
        (
            f"auth:\n  api_keys:\n    - name: a\n      hash: {hash_key('k' * 30)}\n      profile: ro\n",
            "gw.yaml:1: auth: profile 'ro' is not under `auth.profiles` (none defined)",
        ),
        ("auth:\n  jwt:\n    issuer: x\n    audience: y\n", "gw.yaml:2: auth.jwt: give exactly one of `jwks_file`"),
        ("auth:\n  rate_limit: {per_minute: 0, burst: 1}\n", "gw.yaml:2: auth.rate_limit.per_minute: Input should be"),
        ("auth:\n  profiles:\n    p: {server: [x]}\n", "gw.yaml:3: auth.profiles.p.server: unknown setting (did you"),
        ("security:\n  tool_changes: deny\n", "gw.yaml:2: security.tool_changes: Input should be 'warn' or 'block'"),
        ("security:\n  limits:\n    max_result_bytes: 10\n", "gw.yaml:3: security.limits.max_result_bytes: Input"),
    ],
)
def test_the_auth_and_security_sections_report_errors_at_their_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_config(text, Path("gw.yaml"), {})
    assert str(error.value).startswith(expected)


def test_a_key_hash_may_come_from_the_environment() -> None:
    key = new_key()
    text = "auth:\n  api_keys:\n    - {name: ci, hash: '${CI_KEY_HASH}'}\n"
    config = parse_config(text, Path("gw.yaml"), {"CI_KEY_HASH": hash_key(key)})
    assert config.auth.api_keys[0].hash == hash_key(key) and config.auth.enabled
