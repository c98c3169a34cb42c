"""Three replicas behind a real load balancer share one truth: approvals, disables, sessions, limits, feedback.

The `deployment` fixture starts one real PostgreSQL (tests/postgres.py), one upstream over
streamable HTTP that every replica connects to (`tests/servers/poisoned_server.py`: its
`rug_pull` tool changes `weather`'s description), a stdio demo server per replica, three
`python -m gateway serve --transport http` replicas with `GATEWAY_DATABASE_URL` and stateless
HTTP, each with its own empty data dir, and Debian's nginx in front of them (round robin,
tests/load_balancer.py). The replicas re-read the shared state only every 600 s
(`GATEWAY_STATE_RESYNC_SECONDS`) and write their records only every 600 s
(`GATEWAY_RECORDS__FLUSH_INTERVAL`), so what holds within the tests' bounds came through the
change notifications (LISTEN/NOTIFY), not through the periodic fallbacks.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx2
import pytest

from gateway.records.model import FEEDBACK_TOKEN_META_KEY
from gateway.security.auth import hash_key, new_key
from gateway.serving.admin.access import SESSION_COOKIE
from gateway.serving.admin.api import API_PREFIX
from tests.conftest import DEMO_SERVER, NO_EMBEDDINGS, REPO, start_gateway_http, stop_process, write_config
from tests.load_balancer import Balancer, start_balancer, stop_balancer

if TYPE_CHECKING:
    import subprocess

    from tests.postgres import PostgresServer

pytest_plugins = ["tests.postgres"]

POISONED_SERVER = REPO / "tests" / "servers" / "poisoned_server.py"
HOLDS_WITHIN = 15.0
"""Seconds a change may take to hold everywhere in these tests: generous for a loaded CI machine, yet far
below the 600 s resync, so only the notifications can make it (bench/replicas_state.py measures the time)."""
BURST = 6
KEYS = {"root": new_key(), "limited": new_key()}


@dataclass
class Replica:
    process: subprocess.Popen[str]
    base: str
    log: Path
    replica_id: str


@dataclass
class Deployment:
    replicas: list[Replica]
    balancer: Balancer
    database: str
    postgres: PostgresServer
    config: Path
    env: dict[str, str]
    home: Path
    extra: list[Replica] = field(default_factory=list)

    def start_replica(self, replica_id: str) -> Replica:
        """One more replica with an empty data dir of its own (it is stopped by the fixture)."""
        home = self.home / replica_id
        home.mkdir()
        log = home / "gateway.log"
        process, url = start_gateway_http(self.config, home, self.env | {"GATEWAY_REPLICA_ID": replica_id}, log=log)
        replica = Replica(process, url.removesuffix("/mcp"), log, replica_id)
        self.extra.append(replica)
        wait_until_ready(replica)
        return replica


def _rpc(base: str, method: str, params: dict[str, Any], key: str = KEYS["root"]) -> dict[str, Any]:
    """One JSON-RPC request over stateless streamable HTTP (each its own connection, as behind the balancer)."""
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    headers = {
        "Authorization": f"Bearer {key}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-06-18",
    }
    response = httpx2.post(f"{base}/mcp", json=body, headers=headers, timeout=60)
    response.raise_for_status()
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = next(line[5:] for line in text.splitlines() if line.startswith("data:"))
    answer: dict[str, Any] = json.loads(text)
    return answer


def call_tool(base: str, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
    answer = _rpc(base, "tools/call", {"name": name, "arguments": arguments or {}})
    assert "result" in answer, answer
    result: dict[str, Any] = answer["result"]
    return result


def listed(base: str) -> set[str]:
    return {tool["name"] for tool in _rpc(base, "tools/list", {})["result"]["tools"]}


def api(base: str, method: str, path: str, **kwargs: Any) -> httpx2.Response:
    headers = {"Authorization": f"Bearer {KEYS['root']}"} | kwargs.pop("headers", {})
    return httpx2.request(method, f"{base}{API_PREFIX}{path}", headers=headers, timeout=60, **kwargs)


def wait_until_ready(replica: Replica) -> None:
    deadline = time.monotonic() + 60
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {s["server"]: s["state"] for s in api(replica.base, "GET", "/servers").json()["servers"]}
        if states and all(state in ("ready", "disabled") for state in states.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"replica {replica.replica_id}: servers not ready within 60 s: {states}\n{replica.log}")


def holds_everywhere(replicas: list[Replica], check: Callable[[Replica], bool], what: str) -> float:
    """Seconds until `check` holds on every replica (bounded by `HOLDS_WITHIN`)."""
    start = time.monotonic()
    waiting = list(replicas)
    while waiting:
        waiting = [r for r in waiting if not check(r)]
        if waiting and time.monotonic() - start > HOLDS_WITHIN:
            names = ", ".join(r.replica_id for r in waiting)
            raise AssertionError(f"{what}: not so on {names} after {HOLDS_WITHIN} s")
        if waiting:
            time.sleep(0.02)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def deployment(postgres_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    tmp = tmp_path_factory.mktemp("shared")
    upstream = start_upstream(tmp)
    database = f"shared_{secrets.token_hex(4)}"
    with postgres_server.connect(autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{database}"')
    config = write_config(
        tmp / "gateway.yaml",
        f"""
        mcps:
          poisoned: {{url: "{upstream[1]}"}}
          child: {{command: {sys.executable}, args: ["{DEMO_SERVER}", stdio, --name, child]}}
        auth:
          api_keys:
            - {{name: root, hash: "{hash_key(KEYS["root"])}", admin: true,
                rate_limit: {{per_minute: 100000, burst: 100000}}}}
            - {{name: limited, hash: "{hash_key(KEYS["limited"])}", rate_limit: {{per_minute: 1, burst: {BURST}}}}}
        security:
          tool_changes: block
          injection: warn
        """,
    )
    env = {
        "GATEWAY_DATABASE_URL": postgres_server.url_with_password(database),
        "GATEWAY_HTTP__STATELESS": "true",
        "GATEWAY_ROUTING__MODE": "all",
        "GATEWAY_LOG_LEVEL": "INFO",
        "GATEWAY_LOG_FORMAT": "json",
        "GATEWAY_STATE_RESYNC_SECONDS": "600",
        "GATEWAY_RECORDS__FLUSH_INTERVAL": "600",
        "GATEWAY_RELOAD__WATCH": "false",
    } | NO_EMBEDDINGS
    found = Deployment([], None, database, postgres_server, config, env, tmp)  # type: ignore[arg-type]
    try:
        for index in range(3):
            home = tmp / f"r{index}"
            home.mkdir()
            log = home / "gateway.log"
            process, url = start_gateway_http(config, home, env | {"GATEWAY_REPLICA_ID": f"r{index}"}, log=log)
            found.replicas.append(Replica(process, url.removesuffix("/mcp"), log, f"r{index}"))
        for replica in found.replicas:
            wait_until_ready(replica)
        found.balancer = start_balancer([int(r.base.rsplit(":", 1)[1]) for r in found.replicas], tmp / "nginx")
        yield found
    finally:
        if found.balancer is not None:
            stop_balancer(found.balancer)
        for replica in found.replicas + found.extra:
            stop_process(replica.process)
        stop_process(upstream[0])
        with postgres_server.connect(autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{database}" WITH (FORCE)')


def start_upstream(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    """The poisoned server over streamable HTTP on a free port: one upstream every replica reaches."""
    import subprocess

    process = subprocess.Popen(
        [sys.executable, str(POISONED_SERVER), "http"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=tmp,
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if line.startswith("PORT="):
            return process, f"http://127.0.0.1:{int(line.strip()[5:])}/mcp"
        if not line and process.poll() is not None:
            break
    stop_process(process)
    raise RuntimeError("the poisoned server did not print its port")


def tool_state(replica: Replica, name: str) -> str | None:
    rows = api(replica.base, "GET", "/tools").json()["tools"]
    return next((row["state"] for row in rows if row["name"] == name), None)


# ---- approvals and fingerprints -------------------------------------------------------------------------


def test_a_replica_started_after_a_rug_pull_withholds_the_changed_tool_and_an_approval_frees_it_everywhere(
    deployment: Deployment,
) -> None:
    replicas = deployment.replicas
    assert all("poisoned__weather" in listed(r.base) for r in replicas)
    call_tool(replicas[0].base, "poisoned__rug_pull")  # the upstream changes `weather` (replica 0 hears of it)
    holds_everywhere(replicas[:1], lambda r: tool_state(r, "poisoned__weather") == "withheld", "withheld on r0")

    late = deployment.start_replica("late")  # an empty data dir; the upstream already serves the new definition
    assert tool_state(late, "poisoned__weather") == "withheld"
    assert "poisoned__weather" not in listed(late.base)
    refused = call_tool(late.base, "poisoned__weather", {"city": "Oslo"})
    assert refused["isError"] and "withheld" in refused["content"][0]["text"]

    for replica in replicas[1:]:  # the others meet the new definition when they reconnect
        assert api(replica.base, "POST", "/servers/poisoned/restart").status_code == 200
    everyone = [*replicas, late]
    holds_everywhere(everyone, lambda r: tool_state(r, "poisoned__weather") == "withheld", "withheld everywhere")

    approved = api(deployment.balancer.base, "POST", "/tools/poisoned__weather/approve")
    assert approved.status_code == 200, approved.text
    holds_everywhere(everyone, lambda r: "poisoned__weather" in listed(r.base), "approved everywhere")
    for replica in everyone:
        assert call_tool(replica.base, "poisoned__weather", {"city": "Oslo"})["content"][0]["text"] == "sunny in Oslo"


# ---- runtime disables -----------------------------------------------------------------------------------


def test_a_tool_disabled_through_the_balancer_is_refused_by_every_replica_until_enabled(
    deployment: Deployment,
) -> None:
    replicas, balancer = deployment.replicas, deployment.balancer
    assert api(balancer.base, "POST", "/tools/child__echo/disable").status_code == 200
    holds_everywhere(replicas, lambda r: "child__echo" not in listed(r.base), "disabled everywhere")
    for replica in replicas:
        refused = call_tool(replica.base, "child__echo", {"text": "hi"})
        assert refused["isError"] and "disabled by an operator" in refused["content"][0]["text"]
    assert api(balancer.base, "POST", "/tools/child__echo/enable").status_code == 200
    holds_everywhere(replicas, lambda r: "child__echo" in listed(r.base), "enabled everywhere")


def test_a_server_disabled_on_one_replica_is_stopped_on_every_replica_and_one_started_later(
    deployment: Deployment,
) -> None:
    replicas = deployment.replicas
    assert api(replicas[1].base, "POST", "/servers/child/disable").status_code == 200

    def stopped(replica: Replica) -> bool:
        servers = {s["server"]: s for s in api(replica.base, "GET", "/servers").json()["servers"]}
        return servers["child"]["state"] == "disabled"

    holds_everywhere(replicas, stopped, "child disabled everywhere")
    later = deployment.start_replica("later")
    assert stopped(later)
    assert api(deployment.balancer.base, "POST", "/servers/child/enable").status_code == 200
    holds_everywhere([*replicas, later], lambda r: not stopped(r), "child enabled everywhere")


# ---- console sessions -----------------------------------------------------------------------------------


def test_a_console_login_through_the_balancer_holds_on_every_replica_and_a_logout_ends_it_everywhere(
    deployment: Deployment,
) -> None:
    replicas = deployment.replicas
    login = httpx2.post(
        f"{deployment.balancer.base}/admin/login", data={"key": KEYS["root"], "next": "/admin"}, timeout=30
    )
    assert login.status_code == 303, login.text
    cookie = login.cookies[SESSION_COOKIE]

    def page(replica: Replica) -> httpx2.Response:
        return httpx2.get(f"{replica.base}/admin/tools", cookies={SESSION_COOKIE: cookie}, timeout=30)

    for replica in replicas:
        shown = page(replica)
        assert shown.status_code == 200
        assert f"replica {replica.replica_id}" in shown.text  # the page says which replica served it
    csrf = page(replicas[0]).text.split('name="csrf" value="', 1)[1].split('"', 1)[0]
    out = httpx2.post(
        f"{replicas[2].base}/admin/logout", data={"csrf": csrf}, cookies={SESSION_COOKIE: cookie}, timeout=30
    )
    assert out.status_code == 303
    holds_everywhere(replicas, lambda r: page(r).status_code == 401, "logged out everywhere")


# ---- feedback -------------------------------------------------------------------------------------------


def test_feedback_right_after_a_call_is_accepted_through_another_replica(deployment: Deployment) -> None:
    replicas = deployment.replicas
    result = call_tool(replicas[0].base, "child__echo", {"text": "rate me"})
    token = result["_meta"][FEEDBACK_TOKEN_META_KEY]
    rated = httpx2.post(
        f"{replicas[1].base}/feedback",
        json={"token": token, "rating": "up"},
        headers={"Authorization": f"Bearer {KEYS['root']}"},
        timeout=60,
    )
    assert rated.status_code == 200, rated.text  # r0 writes its records every 600 s: it flushed on request
    with deployment.postgres.connect(deployment.database) as db:
        rows = db.execute("SELECT e.replica, f.rating FROM feedback f JOIN executions e ON e.id = f.execution_id")
        assert ("r0", "up") in rows.fetchall()
    detail = api(replicas[2].base, "GET", f"/calls/{token}").json()  # any replica's console shows who made it
    assert detail["replica"] == "r0" and detail["feedback"][0]["rating"] == "up"


# ---- rate limits ----------------------------------------------------------------------------------------


def test_a_keys_burst_holds_across_the_replicas_behind_the_balancer(deployment: Deployment) -> None:
    statuses = []
    for _ in range(BURST * 4):
        response = httpx2.post(
            f"{deployment.balancer.base}/route",
            json={"query": "weather", "k": 1},
            headers={"Authorization": f"Bearer {KEYS['limited']}"},
            timeout=30,
        )
        statuses.append(response.status_code)
    assert set(statuses) <= {200, 429}
    assert statuses.count(200) == BURST  # one bucket for the three replicas (each alone would allow 3x)
    assert statuses[:BURST] == [200] * BURST


# ---- replica identity -----------------------------------------------------------------------------------


def test_records_audit_rows_metrics_and_json_logs_name_the_replica(deployment: Deployment) -> None:
    replicas = deployment.replicas
    for replica in replicas:
        call_tool(replica.base, "child__add", {"a": 1, "b": 2})
        metrics = httpx2.get(
            f"{replica.base}/metrics", headers={"Authorization": f"Bearer {KEYS['root']}"}, timeout=30
        ).text
        assert f'mcp_gateway_replica{{replica="{replica.replica_id}"}} 1.0' in metrics
        assert api(replica.base, "POST", "/servers/child/restart").status_code == 200
    with deployment.postgres.connect(deployment.database) as db:
        audited = {row[0] for row in db.execute("SELECT replica FROM audit WHERE action = 'restart'").fetchall()}
    assert {r.replica_id for r in replicas} <= audited
    audit_page = api(replicas[0].base, "GET", "/audit").json()
    assert {row["replica"] for row in audit_page["audit"]} >= {r.replica_id for r in replicas}
    lines = [json.loads(line) for line in replicas[0].log.read_text().splitlines() if line.startswith("{")]
    assert lines and all(line.get("replica") == "r0" for line in lines)
