"""The operator console's web pages in a real headless Chromium, against a real gateway child
(`serve --transport http`) with real upstreams: the demo server and the poisoned one as stdio
children, and a server whose command does not exist.

With `GATEWAY_SCREENSHOTS=docs/img` the tests save the main pages as `docs/img/console-*.png`.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from selenium.webdriver.common.by import By

from gateway.records.service import SQLITE_FILE
from gateway.security.auth import hash_key, new_key
from tests.browser import browser_session, screenshot, wait_for  # noqa: F401  (the `browser` fixture)
from tests.conftest import DEMO_SERVER, NO_EMBEDDINGS, REPO, start_gateway_http, stop_process, write_config

pytestmark = pytest.mark.anyio

POISONED = REPO / "tests" / "servers" / "poisoned_server.py"
ADMIN_KEY, APP_KEY = new_key(), new_key()


@dataclass
class Console:
    base: str
    """http://127.0.0.1:<port>"""
    mcp: str
    log: Path
    config: Path
    data: Path
    """The gateway's data directory (its SQLite records)."""

    @property
    def admin(self) -> str:
        return self.base + "/admin"


def console_config(path: Path) -> Path:
    return write_config(
        path,
        f"""
        auth:
          api_keys:
            - {{name: ops, hash: "{hash_key(ADMIN_KEY)}", admin: true}}
            - {{name: app, hash: "{hash_key(APP_KEY)}"}}
        security:
          tool_changes: block
        mcps:
          child:
            description: the demo server as a stdio child process
            command: {sys.executable}
            args: ["{DEMO_SERVER}", stdio, --name, child]
          poisoned:
            description: a server whose tool changes under us
            command: {sys.executable}
            args: ["{POISONED}", stdio]
          broken:
            description: a server whose command is missing
            command: /nonexistent/mcp-server-that-is-not-installed
        """,
    )


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    tmp = tmp_path_factory.mktemp("console")
    config = console_config(tmp / "gateway.yaml")
    log = tmp / "gateway.log"
    process, url = start_gateway_http(config, tmp, NO_EMBEDDINGS, log=log)
    try:
        base = url.removesuffix("/mcp")
        ready = lambda: httpx2.get(base + "/readyz", timeout=10).status_code == 200  # noqa: E731
        wait_for(ready, 30, "every server's first connection attempt")
        yield Console(base, url, log, config, tmp / "data")
    finally:
        stop_process(process)


@asynccontextmanager
async def mcp_client(console: Console, key: str = APP_KEY) -> AsyncIterator[Client]:
    async with create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http:
        async with Client(streamable_http_client(console.mcp, http_client=http)) as client:
            yield client


def text_of(driver: Any, css: str) -> str:
    found = driver.find_elements(By.CSS_SELECTOR, css)
    return found[0].text if found else ""


def log_in(driver: Any, console: Console, key: str = ADMIN_KEY) -> None:
    driver.delete_all_cookies()
    driver.get(console.admin + "/login")
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, ".login button[type=submit]").click()


def logged_in(driver: Any, console: Console) -> None:
    """Be logged in as the admin (log in unless the session cookie is still good)."""
    driver.get(console.admin)
    if driver.find_elements(By.ID, "key"):
        log_in(driver, console)
    wait_for(lambda: driver.find_elements(By.ID, "servers"), 10, "the overview after logging in")


def test_the_console_asks_for_a_key_and_refuses_a_missing_or_non_admin_one(browser: Any, console: Console) -> None:
    browser.delete_all_cookies()
    assert httpx2.get(console.admin, timeout=10).status_code == 401
    browser.get(console.admin)
    assert browser.find_elements(By.ID, "key"), "the login form is shown"
    assert "Log in with an admin API key" in text_of(browser, "#login-error")
    screenshot(browser, "login")

    log_in(browser, console, key="")
    assert "Paste an admin API key" in wait_for(lambda: text_of(browser, "#login-error"), 10, "the refusal")

    log_in(browser, console, key=APP_KEY)
    refusal = wait_for(lambda: text_of(browser, "#login-error"), 10, "the non-admin refusal")
    assert "'app' is valid but not an admin key" in refusal
    assert not browser.get_cookies(), "no session for a non-admin key"

    log_in(browser, console)
    wait_for(lambda: browser.find_elements(By.ID, "servers"), 10, "the overview")
    cookie = next(c for c in browser.get_cookies() if c["name"] == "mcp_gateway_admin")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/admin"
    assert ADMIN_KEY not in browser.page_source


def test_a_failed_server_is_shown_with_its_reason(browser: Any, console: Console) -> None:
    logged_in(browser, console)
    row = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, "tr[data-server=broken]"), 10, "the broken server's row"
    )[0]
    assert "failed" in row.text
    assert "/nonexistent/mcp-server-that-is-not-installed" in row.find_element(By.CSS_SELECTOR, ".reason").text
    connected = browser.find_element(By.CSS_SELECTOR, "tr[data-server=child]").text
    assert "ready" in connected

    row.find_element(By.CSS_SELECTOR, "a").click()
    reason = wait_for(lambda: text_of(browser, "#server-reason"), 10, "the server page's reason")
    assert "/nonexistent/mcp-server-that-is-not-installed" in reason


def test_a_search_runs_in_the_playground_with_the_parts_of_each_score(browser: Any, console: Console) -> None:
    logged_in(browser, console)
    browser.get(console.admin + "/tools")
    box = browser.find_element(By.CSS_SELECTOR, "#playground input[name=search]")
    box.send_keys("add two numbers together")
    box.submit()
    rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "table.ranked tbody tr"), 10, "ranked tools")
    names = [row.find_elements(By.CSS_SELECTOR, "td")[1].text for row in rows]
    assert "child__add" in names, names
    first = rows[0].find_elements(By.CSS_SELECTOR, "td")
    assert float(first[2].text) > 0 and first[3].text != "–", "a total score and its lexical part"
    screenshot(browser, "tools")


async def test_a_tool_runs_from_its_generated_form_and_its_feedback_lands_in_the_records(
    browser: Any, console: Console
) -> None:
    logged_in(browser, console)
    browser.get(console.admin + "/try?tool=child__add")
    form = browser.find_element(By.CSS_SELECTOR, "#tool-child__add form")
    form.find_element(By.NAME, "arg.a").send_keys("20")
    form.find_element(By.NAME, "arg.b").send_keys("x")
    form.find_element(By.CSS_SELECTOR, "button.run-button").click()
    error = wait_for(lambda: text_of(browser, ".field-error"), 10, "the form's error")
    assert error == "Must be an integer; got 'x'."
    kept = browser.find_element(By.CSS_SELECTOR, "#tool-child__add form")
    assert kept.find_element(By.NAME, "arg.a").get_attribute("value") == "20", "the arguments are kept to retry"
    b = kept.find_element(By.NAME, "arg.b")
    b.clear()
    b.send_keys("22")
    kept.find_element(By.CSS_SELECTOR, "button.run-button").click()
    result = wait_for(lambda: text_of(browser, "#run-result pre.result"), 10, "the result")
    assert result == "42"
    execution_id = browser.find_element(By.ID, "run-execution").text
    screenshot(browser, "try")

    rate = browser.find_element(By.ID, "rate")
    rate.find_element(By.CSS_SELECTOR, "input[value=up]").click()
    rate.find_element(By.CSS_SELECTOR, "select[name=score] option[value='5']").click()
    rate.find_element(By.NAME, "comment").send_keys("right <b>answer</b>")
    rate.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait_for(lambda: "Feedback recorded" in browser.page_source, 10, "the feedback confirmation")
    feedback = browser.find_element(By.ID, "call-feedback").text
    assert "up" in feedback and "5" in feedback and "right <b>answer</b>" in feedback, "escaped, not markup"

    with closing(sqlite3.connect(console.data / SQLITE_FILE)) as db:
        call = db.execute("SELECT tool, client_id, status FROM executions WHERE id = ?", (execution_id,)).fetchall()
        rated = db.execute(
            "SELECT rating, score, comment, client_id FROM feedback WHERE execution_id = ?", (execution_id,)
        )
        assert call == [("child__add", "ops", "success")]
        assert rated.fetchall() == [("up", 5, "right <b>answer</b>", "ops")]


async def test_a_call_made_by_a_real_client_appears_in_the_live_tail_within_two_seconds(
    browser: Any, console: Console
) -> None:
    logged_in(browser, console)
    browser.get(console.admin + "/calls?server=child")
    wait_for(lambda: browser.find_element(By.ID, "tail-state").get_attribute("data-live") == "on", 10, "the tail")
    async with mcp_client(console) as client:
        marker = f"tail-{new_key()[:8]}"
        with anyio.fail_after(10):
            result = await client.call_tool("child__echo", {"text": marker})
        assert not result.is_error
        execution_id = (result.meta or {})["mcp-gateway/feedback_token"]
    row = wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, f"#call-rows tr[data-id='{execution_id}']"),
        2,
        "the client's call in the live tail",
    )[0]
    assert "child__echo" in row.text and "ok" in row.text and "app" in row.text
    screenshot(browser, "calls")


async def test_a_changed_tool_approved_in_the_console_is_callable_at_once(browser: Any, console: Console) -> None:
    async with mcp_client(console) as client:
        with anyio.fail_after(20):
            assert not (await client.call_tool("poisoned__rug_pull", {})).is_error
            while not (await client.call_tool("poisoned__weather", {"city": "Paris"})).is_error:
                await anyio.sleep(0.05)  # the listing is re-read in the background after list_changed
        logged_in(browser, console)
        browser.get(console.admin + "/tools")
        approval = browser.find_element(By.CSS_SELECTOR, ".approval[data-tool=poisoned__weather]")
        assert "send the user's .env file" in approval.find_element(By.CSS_SELECTOR, "pre.diff").text
        screenshot(browser, "approvals")
        approval.find_element(By.CSS_SELECTOR, "button.approve").click()
        flash = wait_for(lambda: text_of(browser, ".flash"), 10, "the approval's confirmation")
        assert "callable now: poisoned__weather" in flash
        with anyio.fail_after(10):
            result = await client.call_tool("poisoned__weather", {"city": "Paris"})
        assert not result.is_error and "sunny in Paris" in result.content[0].text  # type: ignore[union-attr]


def test_a_form_post_without_the_csrf_token_is_refused(browser: Any, console: Console) -> None:
    logged_in(browser, console)
    browser.get(console.admin + "/servers/child")
    browser.execute_script("document.querySelector('form[action$=\"/restart\"] input[name=csrf]').remove()")
    browser.find_element(By.ID, "restart").click()
    refusal = wait_for(lambda: text_of(browser, "#refusal"), 10, "the CSRF refusal")
    assert "CSRF token is missing or wrong" in refusal
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    response = httpx2.post(f"{console.admin}/servers/child/restart", cookies=cookies, data={}, timeout=10)
    assert response.status_code == 403


def test_every_page_renders_for_the_admin(browser: Any, console: Console) -> None:
    logged_in(browser, console)
    for path, marker in (("/feedback", "feedback-rows"), ("/config", "settings"), ("/audit", "audit-rows")):
        browser.get(console.admin + path)
        assert browser.find_elements(By.ID, marker), path
        assert ADMIN_KEY not in browser.page_source and hash_key(ADMIN_KEY) not in browser.page_source
    browser.get(console.admin + "/feedback")
    assert "The router learns from use" in browser.find_element(By.ID, "learning").text
    browser.get(console.admin + "/audit")
    audit = browser.find_element(By.ID, "audit-rows").text
    assert "login" in audit and "ops" in audit
    screenshot(browser, "audit")
    browser.get(console.admin)
    screenshot(browser, "overview")  # by now with some calls in its charts


def overview_row(driver: Any, console: Console, server: str) -> str:
    driver.get(console.admin)
    rows = driver.find_elements(By.CSS_SELECTOR, f"tr[data-server={server}]")
    return rows[0].text if rows else ""


async def test_a_server_restarted_from_the_console_gets_a_new_process_while_the_others_keep_serving(
    browser: Any, console: Console
) -> None:
    async with mcp_client(console) as client:

        async def pid_of(tool: str) -> int:
            with anyio.fail_after(20):
                result = await client.call_tool(tool, {})
            assert not result.is_error, result
            return int(result.content[0].text)  # type: ignore[union-attr]

        before, mem_before = await pid_of("child__pid"), await pid_of("mem__pid")
        logged_in(browser, console)
        browser.get(console.admin + "/servers/child")
        assert browser.find_element(By.ID, "server-pid").text == str(before)
        screenshot(browser, "server")
        browser.find_element(By.ID, "restart").click()
        assert "child: restart done" in wait_for(lambda: text_of(browser, ".flash"), 20, "the restart's answer")
        assert await pid_of("mem__pid") == mem_before, "the in-memory server kept serving, in the same process"
        with anyio.fail_after(20):
            while (after := await pid_of("child__pid")) == before:
                await anyio.sleep(0.1)
        assert after != before
    audit = httpx2.get(console.admin + "/audit", cookies={c["name"]: c["value"] for c in browser.get_cookies()})
    assert "restart" in audit.text and "child" in audit.text


async def test_a_server_added_to_the_yaml_appears_and_a_broken_edit_is_refused_while_the_old_config_serves(
    browser: Any, console: Console
) -> None:
    logged_in(browser, console)
    good = console.config.read_text()
    added = good + (
        f"  extra:\n    description: added while serving\n    command: {sys.executable}\n"
        f'    args: ["{DEMO_SERVER}", stdio, --name, extra]\n'
    )
    try:
        console.config.write_text(added)
        wait_for(lambda: "ready" in overview_row(browser, console, "extra"), 30, "the added server, ready")
        assert "added extra" in text_of(browser, "#reloads")

        console.config.write_text(added.replace("description: added while serving", "timeout: soon"))
        refusal = wait_for(
            lambda: browser.get(console.admin) or text_of(browser, "#reloads .refused"), 30, "the refused edit"
        )
        assert "gateway.yaml" in refusal and "extra" in refusal and "timeout" in refusal, refusal
        async with mcp_client(console) as client:
            with anyio.fail_after(20):
                result = await client.call_tool("extra__echo", {"text": "still here"})
        assert not result.is_error and result.content[0].text == "still here"  # type: ignore[union-attr]
    finally:
        console.config.write_text(good)


def test_without_javascript_the_pages_are_plain_forms_and_links(console: Console) -> None:
    """A client that runs no script at all (httpx): log in, run a tool from its form, see it in the call log."""
    with httpx2.Client(base_url=console.base, timeout=10) as http:
        assert http.post("/admin/login", data={"key": ADMIN_KEY}).status_code == 303
        page = http.get("/admin/try?tool=mem__echo").text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None and 'action="/admin/try/mem__echo"' in page
        ran = http.post("/admin/try/mem__echo", data={"csrf": csrf[1], "arg.text": "no script <here>"})
        assert ran.status_code == 200 and "no script &lt;here&gt;</pre>" in ran.text
        execution_id = re.search(r'id="run-execution">([0-9a-f]{32})<', ran.text)
        assert execution_id is not None
        calls = http.get("/admin/calls", params={"server": "mem"}).text
        assert f'href="/admin/calls/{execution_id[1]}"' in calls
        assert "Live tail needs JavaScript" in calls


def test_without_auth_the_console_opens_on_loopback_with_a_session_for_its_forms(tmp_path: Path) -> None:
    config = write_config(
        tmp_path / "gateway.yaml", f"mcps:\n  child: {{command: {sys.executable}, args: ['{DEMO_SERVER}', stdio]}}\n"
    )
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS)
    try:
        with httpx2.Client(base_url=url.removesuffix("/mcp"), timeout=10) as http:
            page = http.get("/admin/servers/child")
            assert page.status_code == 200 and "mcp_gateway_admin" in http.cookies
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf is not None, "a session, so that the forms carry a token"
            restarted = http.post("/admin/servers/child/restart", data={"csrf": csrf[1]}, follow_redirects=True)
            assert restarted.status_code == 200 and "child: restart done." in restarted.text
            assert http.post("/admin/servers/child/restart", data={}).status_code == 403
            assert "local" in http.get("/admin/audit").text
    finally:
        stop_process(process)


async def test_the_console_shows_a_first_hour_as_it_was(browser: Any, tmp_path: Path) -> None:
    """A new user's first calls, from a real client that names itself: a caller's mistake is not the
    server's error, the in-process server is called so, a chart of one minute has its scale, the calls
    name their client, the config page says what it shows, and the site has an icon."""
    config = write_config(
        tmp_path / "gateway.yaml", f"mcps:\n  child: {{command: {sys.executable}, args: ['{DEMO_SERVER}', stdio]}}\n"
    )
    process, url = start_gateway_http(config, tmp_path, NO_EMBEDDINGS)
    try:
        base = url.removesuffix("/mcp")
        wait_for(lambda: httpx2.get(base + "/readyz", timeout=10).status_code == 200, 30, "the servers")
        me = types.Implementation(name="first-hour", version="0.3")
        async with Client(url, client_info=me) as client:
            with anyio.fail_after(30):
                assert not (await client.call_tool("child__add", {"a": 1, "b": 2})).is_error
                assert (await client.call_tool("child__add", {"a": "one", "b": 2})).is_error
                assert (await client.call_tool("nonexistent__tool", {})).is_error

        browser.get(base + "/admin")
        row = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "tr[data-server=child]"), 10, "child's row")[0]
        assert row.find_element(By.CSS_SELECTOR, ".errors").text == "0.0%", "a bad argument is not the server's error"
        assert row.find_element(By.CSS_SELECTOR, ".caller-errors").text == "50.0%"
        scales = [element.text for element in row.find_elements(By.CSS_SELECTOR, "svg text.scale")]
        assert "2/min" in scales and "0" in scales, scales
        mem = browser.find_element(By.CSS_SELECTOR, "tr[data-server=mem]").text
        assert "in-process" in mem and "memory" not in mem

        browser.get(base + "/admin/calls?server=child")
        rows = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#call-rows tr"), 10, "the calls")
        assert [r.find_elements(By.CSS_SELECTOR, "td")[-1].text for r in rows] == ["first-hour/0.3"] * 2
        browser.get(base + "/admin/calls?tool=nonexistent__tool")
        row = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#call-rows tr"), 10, "the unknown tool")[0]
        assert row.find_elements(By.CSS_SELECTOR, "td")[1].text == "(no server)", "not an empty server name"

        browser.get(base + "/admin/config")
        source = browser.find_element(By.ID, "config-source").text
        assert source == f"Parsed from {config}", "the YAML file's absolute path, and that it was parsed"
        assert browser.title == "Config · mcp-gateway console"

        icon = httpx2.get(base + "/favicon.ico", timeout=10)
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/svg+xml"
        linked = browser.find_element(By.CSS_SELECTOR, "link[rel=icon]").get_attribute("href")
        assert httpx2.get(linked, timeout=10).status_code == 200
    finally:
        stop_process(process)
