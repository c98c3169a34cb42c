"""`gateway.lazy_timers`: what falls due, in what order, and never before its time, on a real loop."""

from __future__ import annotations

import asyncio

import anyio
import pytest

from gateway.lazy_timers import EARLY, DueQueue, LazyDeadline

pytestmark = pytest.mark.anyio

DELAY = 0.05
BOUND = 30.0
"""How long a test waits for what must happen (a loaded machine may run the loop late)."""


async def _until(condition) -> None:  # type: ignore[no-untyped-def]
    with anyio.fail_after(BOUND):
        while not condition():
            await asyncio.sleep(0.01)


async def test_due_items_fall_due_in_order_not_before_their_time_and_done_ones_never() -> None:
    loop = asyncio.get_running_loop()
    fired: list[tuple[str, float]] = []
    queue: DueQueue[str] = DueQueue(loop, DELAY, lambda item: fired.append((item, loop.time())))
    added = {}
    entries = {}
    for name in "abcd":
        added[name] = loop.time()
        entries[name] = queue.add(name)
    entries["b"].done()
    entries["d"].done()
    assert len(queue) == 2
    await _until(lambda: len(fired) == 2)
    await asyncio.sleep(DELAY * 2)  # past every deadline: nothing more falls due
    assert [name for name, _ in fired] == ["a", "c"]
    for name, at in fired:
        assert at >= added[name] + DELAY - EARLY
    assert len(queue) == 0


async def test_an_item_added_after_the_queue_emptied_still_falls_due() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    queue: DueQueue[str] = DueQueue(loop, DELAY, fired.append)
    queue.add("first").done()
    await asyncio.sleep(DELAY * 2)  # the timer fires on an entry that is done, and stops
    queue.add("second")
    await _until(lambda: fired == ["second"])


async def test_on_due_may_add_to_its_own_queue() -> None:
    loop = asyncio.get_running_loop()
    fired: list[int] = []

    def again(n: int) -> None:
        fired.append(n)
        if n < 3:
            queue.add(n + 1)

    queue: DueQueue[int] = DueQueue(loop, DELAY, again)
    queue.add(1)
    await _until(lambda: fired == [1, 2, 3])


async def test_close_drops_every_entry() -> None:
    loop = asyncio.get_running_loop()
    fired: list[str] = []
    queue: DueQueue[str] = DueQueue(loop, DELAY, fired.append)
    queue.add("a")
    queue.close()
    await asyncio.sleep(DELAY * 2)
    assert fired == []


async def test_a_deadline_moved_later_fires_once_at_the_later_time() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = LazyDeadline(loop, lambda: fired.append(loop.time()))
    deadline.set(loop.time() + DELAY)
    later = loop.time() + DELAY * 3
    deadline.set(later)
    await _until(lambda: fired)
    await asyncio.sleep(DELAY)
    assert len(fired) == 1
    assert fired[0] >= later - EARLY
    assert deadline.at is None


async def test_a_deadline_moved_earlier_fires_at_the_earlier_time() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = LazyDeadline(loop, lambda: fired.append(loop.time()))
    deadline.set(loop.time() + 3600)
    earlier = loop.time() + DELAY
    deadline.set(earlier)
    await _until(lambda: fired)
    assert fired[0] >= earlier - EARLY


async def test_a_cleared_deadline_does_not_fire_until_set_again() -> None:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    deadline = LazyDeadline(loop, lambda: fired.append(loop.time()))
    deadline.set(loop.time() + DELAY)
    deadline.clear()
    await asyncio.sleep(DELAY * 2)
    assert fired == []
    deadline.set(loop.time() + DELAY)
    await _until(lambda: fired)
    deadline.set(loop.time() + DELAY)
    deadline.close()
    await asyncio.sleep(DELAY * 2)
    assert len(fired) == 1
