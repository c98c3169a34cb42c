"""The packaging in `deploy/` and the `Dockerfile`: linted, and the image's contract run for real.

No Docker engine and no base image can be had here, so the image is tested from outside: its
Dockerfile passes hadolint; the steps it runs (the bundled model's check at build, the
ENTRYPOINT and CMD with the image's ENV, the HEALTHCHECK) are read from the Dockerfile and run on
this machine, with the image's paths mapped to the installed gateway and a temporary data dir.
The Kubernetes manifests are validated against the schemas of Kubernetes 1.37 (strict), the
compose file against the compose-spec schema, and their drain settings checked against each other.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import yaml

from gateway.security.auth import hash_key, new_key
from tests.conftest import NO_EMBEDDINGS, REPO, START_DEADLINE, _read_line_with_prefix, free_port
from tests.load_balancer import nginx_binary

DOCKERFILE = REPO / "Dockerfile"
DEPLOY = REPO / "deploy"
BIN = Path(sys.executable).parent
KUBERNETES_VERSION = "1.37.0"
IMAGE_PREFIX = "/opt/mcp-gateway"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def _tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} is missing: `scripts/bootstrap test` installs it (the test extra)"
    return str(path)


# ---- the Dockerfile ------------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in DOCKERFILE.read_text().splitlines():
        if raw.strip().startswith("#") and not current:
            continue
        current += raw.rstrip("\\").strip() + " " if raw.rstrip().endswith("\\") else raw.strip()
        if not raw.rstrip().endswith("\\"):
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                lines.append((word.upper(), rest.strip()))
            current = ""
    return lines


def _final_stage() -> list[tuple[str, str]]:
    instructions = _instructions()
    last_from = max(i for i, (word, _) in enumerate(instructions) if word == "FROM")
    return instructions[last_from:]


def _image_env() -> dict[str, str]:
    env: dict[str, str] = {}
    for word, rest in _final_stage():
        if word == "ENV":
            for part in shlex.split(rest):
                name, _, value = part.partition("=")
                env[name] = value
    return env


def _exec_form(word: str) -> list[str]:
    found = [rest for w, rest in _final_stage() if w == word]
    assert len(found) == 1, f"one {word} in the final stage"
    rest = found[0]
    if word == "HEALTHCHECK":
        rest = rest.split(" CMD ", 1)[1]
    value = json.loads(rest)
    assert isinstance(value, list), f"{word} in exec form (a JSON list), so signals reach the gateway"
    return [str(v) for v in value]


def _here(argument: str, data_dir: Path) -> str:
    """An image path as this machine has it: the installed gateway, the repository's files, a temp data dir."""
    mapping = {
        f"{IMAGE_PREFIX}/healthcheck.py": str(DEPLOY / "docker" / "healthcheck.py"),
        f"{IMAGE_PREFIX}/bin/": f"{BIN}/",
        "/etc/mcp-gateway/gateway.yaml": str(DEPLOY / "gateway.yaml"),
        "/var/lib/mcp-gateway": str(data_dir),
    }
    for image_path, local in mapping.items():
        argument = argument.replace(image_path, local)
    return argument


def test_the_dockerfile_passes_hadolint() -> None:
    done = subprocess.run([_tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_image_is_multi_stage_slim_non_root_and_health_checked() -> None:
    instructions = _instructions()
    stages = [rest for word, rest in instructions if word == "FROM"]
    assert len(stages) == 2 and all("${PYTHON_IMAGE}" in s for s in stages)
    assert re.search(r"ARG PYTHON_IMAGE=python:3\.11-slim", DOCKERFILE.read_text())
    users = [rest for word, rest in _final_stage() if word == "USER"]
    assert users and not users[-1].startswith(("0", "root"))
    assert _exec_form("HEALTHCHECK")[-1].endswith("healthcheck.py")
    env = _image_env()
    assert (
        env["GATEWAY_CONFIG"] == "/etc/mcp-gateway/gateway.yaml" and env["GATEWAY_DATA_DIR"] == "/var/lib/mcp-gateway"
    )


def test_the_image_build_verifies_the_bundled_model(tmp_path: Path) -> None:
    checks = [rest for word, rest in _final_stage() if word == "RUN" and "prepare_model_dir" in rest]
    assert len(checks) == 1
    command = [_here(part, tmp_path / "data") for part in json.loads(checks[0])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "bundled model verified" in done.stdout
    assert (tmp_path / "data" / "models").is_dir()


def _image_environment(data_dir: Path, port: int, **extra: str) -> dict[str, str]:
    """The image's ENV with its paths mapped here, bound to 127.0.0.1 (0.0.0.0 is the container's own
    network namespace; tests listen on loopback) on `port`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    env.update({name: _here(value, data_dir) for name, value in _image_env().items() if name != "PATH"})
    env["PATH"] = f"{BIN}:{os.environ.get('PATH', '')}"
    env.update(NO_EMBEDDINGS | {"GATEWAY_HTTP__HOST": "127.0.0.1", "GATEWAY_HTTP__PORT": str(port)})
    env.update(extra)
    return env


def _healthcheck(env: dict[str, str], data_dir: Path) -> int:
    command = [_here(part, data_dir) for part in _exec_form("HEALTHCHECK")]
    return subprocess.run(command, env=env, capture_output=True, timeout=30).returncode


def test_the_image_entrypoint_serves_with_its_environment_and_its_healthcheck_follows_it(tmp_path: Path) -> None:
    data_dir, port, key = tmp_path / "data", free_port(), new_key()
    env = _image_environment(data_dir, port, GATEWAY_OPS_KEY_HASH=hash_key(key))
    command = [_here(part, data_dir) for part in _exec_form("ENTRYPOINT") + _exec_form("CMD")]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _read_line_with_prefix(process.stderr, "mcp-gateway: serving on ", START_DEADLINE, process)
        assert _healthcheck(env, data_dir) == 0
        base = f"http://127.0.0.1:{port}"
        with_key = httpx2.post(f"{base}/mcp", json=INITIALIZE, headers=MCP_HEADERS | {"Authorization": f"Bearer {key}"})
        assert with_key.status_code == 200
        assert httpx2.post(f"{base}/mcp", json=INITIALIZE, headers=MCP_HEADERS).status_code == 401
        assert (data_dir / "gateway.runtime.json").exists()  # the named data dir is used as it is
        process.send_signal(signal.SIGTERM)  # what `docker stop` sends (STOPSIGNAL)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        assert process.stderr is not None
        process.stderr.close()
    assert _healthcheck(env, data_dir) == 1


def test_the_image_refuses_to_start_without_the_key_hash_its_config_needs(tmp_path: Path) -> None:
    env = _image_environment(tmp_path / "data", free_port())
    command = [_here(part, tmp_path / "data") for part in _exec_form("ENTRYPOINT") + _exec_form("CMD")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "GATEWAY_OPS_KEY_HASH" in done.stderr


def test_the_image_with_a_config_without_auth_refuses_to_serve_on_all_addresses(tmp_path: Path) -> None:
    config = tmp_path / "open.yaml"
    config.write_text("mcps: {}\n")
    env = _image_environment(tmp_path / "data", free_port(), GATEWAY_CONFIG=str(config))
    env["GATEWAY_HTTP__HOST"] = _image_env()["GATEWAY_HTTP__HOST"]  # the image's own: refused before binding
    command = [_here(part, tmp_path / "data") for part in _exec_form("ENTRYPOINT") + _exec_form("CMD")]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "refusing to serve HTTP on 0.0.0.0 without authentication" in done.stderr


# ---- Kubernetes ----------------------------------------------------------------------------------


def _manifests() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                found[document["kind"]] = document
    return found


def test_the_kubernetes_manifests_validate_strictly_against_a_current_kubernetes() -> None:
    files = sorted(str(p) for p in (DEPLOY / "kubernetes").glob("*.yaml"))
    command = [_tool("kubernetes-validate"), "--strict", "-k", KUBERNETES_VERSION, *files]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("passed") == len(files)


def test_the_kubernetes_deployment_probes_drains_and_takes_its_secrets_by_reference() -> None:
    manifests = _manifests()
    assert {
        "Deployment",
        "Service",
        "ConfigMap",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "NetworkPolicy",
    } <= set(manifests)
    pod = manifests["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in container["env"]}
    drain = float(env["GATEWAY_HTTP__DRAIN_SECONDS"]["value"])
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + drain  # the drain ends before SIGKILL
    assert "value" not in env["GATEWAY_DATABASE_URL"] and env["GATEWAY_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (
        manifests["HorizontalPodAutoscaler"]["spec"]["minReplicas"]
        >= manifests["PodDisruptionBudget"]["spec"]["minAvailable"] + 1
    )
    config = yaml.safe_load(manifests["ConfigMap"]["data"]["gateway.yaml"])
    assert config["auth"]["api_keys"]  # reachable means authenticated


# ---- compose and systemd -------------------------------------------------------------------------


def test_the_compose_file_validates_against_the_compose_spec() -> None:
    command = [_tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(DEPLOY / "compose.yaml")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_compose_file_runs_two_gateways_on_one_postgres_behind_a_balancer_with_an_optional_collector() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    gateways = [name for name, service in services.items() if service.get("image") == "mcp-gateway:local"]
    assert len(gateways) == 2
    for name in gateways:
        env = services[name]["environment"]
        assert env["GATEWAY_HTTP__STATELESS"] == "true" and "@postgres:5432/" in env["GATEWAY_DATABASE_URL"]
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "postgres" in services and services["otel-collector"]["profiles"] == ["otel"]
    upstreams = re.findall(r"server (\S+):8765", (DEPLOY / "nginx" / "nginx.conf").read_text())
    assert sorted(upstreams) == sorted(gateways)
    for mounted in ("./gateway.yaml", "./nginx/nginx.conf", "./otel-collector.yaml"):
        assert (DEPLOY / mounted).exists()


def test_the_systemd_unit_starts_the_gateway_reloads_with_sighup_and_gives_the_drain_time() -> None:
    entries: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / "mcp-gateway.service").read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            entries.setdefault(key.strip(), []).append(value.strip())
    assert entries["ExecStart"] == ["/opt/mcp-gateway/bin/mcp-gateway serve --transport http"]
    assert entries["ExecReload"] == ["/bin/kill -HUP $MAINPID"] and entries["KillSignal"] == ["SIGTERM"]
    environment = dict(value.split("=", 1) for value in entries["Environment"])
    assert float(entries["TimeoutStopSec"][0]) > float(environment["GATEWAY_HTTP__DRAIN_SECONDS"])
    assert environment["GATEWAY_HTTP__HOST"] == "127.0.0.1"  # one host: the reverse proxy in front reaches it
    assert entries["DynamicUser"] == ["yes"] and entries["StateDirectory"] == ["mcp-gateway"]


def test_the_build_context_lets_in_everything_the_dockerfile_copies_and_little_else() -> None:
    allowed = {
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    }
    assert "*" in (REPO / ".dockerignore").read_text().splitlines()  # all else stays out (.venv, .git, tests)
    for word, rest in _instructions():
        if word == "COPY" and not rest.startswith("--from"):
            for source in shlex.split(rest)[:-1]:
                assert source.rstrip("/") in allowed, f"COPY {source} is kept out of the build context"


def test_the_compose_load_balancers_nginx_config_is_accepted_by_nginx(tmp_path: Path) -> None:
    """`nginx -t` of deploy/nginx/nginx.conf, with the replicas' compose names (which do not resolve
    here) put as 127.0.0.1 addresses and the files nginx writes under a temporary prefix."""
    config = re.sub(r"server gateway-\d+:8765", "server 127.0.0.1:9", (DEPLOY / "nginx" / "nginx.conf").read_text())
    (tmp_path / "nginx.conf").write_text(config)
    nginx = nginx_binary()
    command = [nginx, "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"), "-e", str(tmp_path / "error.log")]
    done = subprocess.run([*command, "-g", f"pid {tmp_path}/nginx.pid;"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "syntax is ok" in done.stderr
