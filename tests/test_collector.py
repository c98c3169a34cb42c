"""The start-up's objects frozen (`gateway.collector`): after the servers settle and the router is complete."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import anyio
import pytest

from gateway.collector import freeze_after_start
from gateway.config.settings import Settings

pytestmark = pytest.mark.anyio


class Servers:
    """The registry's one method the freeze waits on."""

    def __init__(self) -> None:
        self.settled = anyio.Event()

    async def wait_settled(self, timeout: float | None = None) -> None:
        with anyio.move_on_after(timeout):
            await self.settled.wait()


class Router:
    def __init__(self) -> None:
        self.complete = anyio.Event()


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


async def test_it_freezes_once_the_servers_settle_and_the_router_is_complete(unfrozen: None) -> None:
    servers, router = Servers(), Router()
    async with anyio.create_task_group() as tg:
        tg.start_soon(freeze_after_start, servers, router, Settings(startup_timeout=30))  # type: ignore[arg-type]
        await anyio.sleep(0.05)
        assert gc.get_freeze_count() == 0
        servers.settled.set()
        await anyio.sleep(0.05)
        assert gc.get_freeze_count() == 0  # the router is still being built
        router.complete.set()
    assert gc.get_freeze_count() > 0


async def test_a_router_that_never_completes_does_not_stop_the_freeze(unfrozen: None) -> None:
    servers, router = Servers(), Router()
    servers.settled.set()
    with anyio.fail_after(10):
        await freeze_after_start(servers, router, Settings(startup_timeout=0.2))  # type: ignore[arg-type]
    assert gc.get_freeze_count() > 0
