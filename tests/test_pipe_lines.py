"""`gateway.upstreams.pipe_lines`: lines from a real non-blocking pipe, the fast ones served in the
read callback, the rest handed on in order by the task, reading paused while it is busy."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

import anyio
import pytest

from gateway.upstreams.pipe_lines import read_lines

pytestmark = pytest.mark.anyio


def _splitter() -> Callable[[bytes], list[bytes]]:
    pending: list[bytes] = []

    def split(chunk: bytes) -> list[bytes]:
        *lines, rest = (b"".join(pending) + chunk).split(b"\n")
        pending[:] = [rest]
        return lines

    return split


async def test_lines_keep_their_order_across_fast_and_slow_and_reading_resumes() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    seen: list[tuple[str, bytes]] = []
    gate = anyio.Event()
    split = _splitter()

    def fast(line: bytes) -> bool:
        if line.startswith(b"f"):
            seen.append(("fast", line))
            return True
        return False

    async def slow(line: bytes) -> None:
        if line == b"s1":
            await gate.wait()  # the task is busy: what follows waits behind it
        seen.append(("slow", line))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_lines, read_end, split, fast, slow)
            os.write(write_end, b"f1\nf2\ns1\nf3\n")
            await anyio.sleep(0.05)
            assert seen == [("fast", b"f1"), ("fast", b"f2")]  # f3 waits behind s1
            os.write(write_end, b"f4\ns")  # not read while s1 waits; a partial line too
            await anyio.sleep(0.05)
            gate.set()
            await anyio.sleep(0.05)
            os.write(write_end, b"2\nf5\n")
            await anyio.sleep(0.05)
            os.close(write_end)
            write_end = -1
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    assert seen == [
        ("fast", b"f1"),
        ("fast", b"f2"),
        ("slow", b"s1"),
        ("fast", b"f3"),
        ("fast", b"f4"),
        ("slow", b"s2"),
        ("fast", b"f5"),
    ]


async def test_end_of_file_returns_after_the_slow_lines_and_a_cancel_unregisters_the_pipe() -> None:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    seen: list[bytes] = []
    split = _splitter()

    async def slow(line: bytes) -> None:
        await anyio.sleep(0.01)
        seen.append(line)

    os.write(write_end, b"a\nb\n")
    os.close(write_end)
    with anyio.fail_after(5):
        await read_lines(read_end, split, lambda line: False, slow)
    assert seen == [b"a", b"b"]
    os.close(read_end)

    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    with anyio.move_on_after(0.05):
        await read_lines(read_end, split, lambda line: False, slow)
    assert not asyncio.get_running_loop().remove_reader(read_end)  # the cancel unregistered it
    os.close(read_end)
    os.close(write_end)
