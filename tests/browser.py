"""A real headless Chromium for the console's browser tests: Debian's `chromium` driven by selenium
through Debian's `chromedriver` (`scripts/test` installs both when missing). A test module imports
`browser_session`, which is the `browser` fixture.

Selenium is pointed at the driver explicitly and told to stay offline (`SE_OFFLINE`): its Selenium
Manager would otherwise try to download a browser and a driver. Chromium gets the flags that keep
it from reaching out to the network (without them, on a closed network it hangs at start-up) and a
fresh profile. A missing browser is a failure that says what to install, never a silent skip.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
PAGE_LOAD_SECONDS = 30
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1280,900",
)

__all__ = ["CHROMEDRIVER", "CHROMIUM", "browser_session", "screenshot", "wait_for"]


def _missing() -> str | None:
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not os.access(path, os.X_OK)]
    if not missing:
        return None
    return (
        f"the browser tests need Debian's chromium and chromium-driver ({', '.join(missing)} missing): "
        "run scripts/test, or `apt-get install chromium chromium-driver` as root"
    )


@pytest.fixture(scope="session", name="browser")
def browser_session() -> Iterator[Any]:
    """One headless Chromium for the session (it takes a second or two to start); quit at the end."""
    problem = _missing()
    if problem is not None:
        pytest.fail(problem)
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="console-browser-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_SECONDS)
    driver.set_script_timeout(PAGE_LOAD_SECONDS)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll `condition` (a browser read, so no event to wait on) until it returns something truthy;
    fail saying `what` did not happen within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout:g} s (last seen: {last!r:.300})")


def screenshot(driver: Any, name: str) -> None:
    """Save the page as `console-<name>.png` in `$GATEWAY_SCREENSHOTS` (e.g. docs/img), when it is set."""
    folder = os.environ.get("GATEWAY_SCREENSHOTS")
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return Math.min(document.body.scrollHeight, 2400)")
    driver.set_window_size(1280, max(700, int(height)))
    driver.save_screenshot(str(Path(folder) / f"console-{name}.png"))
    driver.set_window_size(1280, 900)
