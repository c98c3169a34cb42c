"""Keep a large result from ratcheting the serving process's memory up for good.

glibc's malloc serves blocks above its mmap threshold (128 KiB at start) with mmap and
returns them to the system when freed, but each such free *raises* the threshold to the
size of the freed block (up to 32 MiB). After one 10 MB tool result, every later block
under 10 MB comes from the heap, and a heap fragmented by a burst of them is never given
back: measured, four 10 MB results took a gateway from 106 to 138 MB of RSS for good.
Fixing the threshold keeps large blocks on mmap (106 -> 107 MB); the calls' own blocks are
far smaller, so the hot path does not change.

The threshold sits above 256 KiB, and the heap's top is trimmed only past 4 MiB, because
asyncio reads every socket and pipe into a fresh 256 KiB bytes object and shrinks it to what
came: with the threshold at glibc's starting 128 KiB each read was an mmap, two page faults and
an munmap, and with a 128 KiB trim threshold a heap block grew and shrank the heap by brk on
every read (a 400-byte send and recv on a socket pair: 28 us against 3.5 us with these two
values; the gateway reads at least twice a proxied call, in turns with two other processes).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

__all__ = ["MMAP_THRESHOLD", "fix_mmap_threshold", "trim_heap"]

logger = logging.getLogger(__name__)

MMAP_THRESHOLD = 512 * 1024
"""Bytes: blocks from this size up are mmapped and given back when freed; fixed, not ratcheted.
Above asyncio's 256 KiB read buffer, so that a read is served from the heap."""
TRIM_THRESHOLD = 4 * 1024 * 1024
"""Bytes of free memory at the heap's top kept rather than given back with brk at once."""

_M_TRIM_THRESHOLD = -1  # glibc's malloc.h
_M_MMAP_THRESHOLD = -3


def _glibc() -> ctypes.CDLL | None:
    """The C library, if this is Linux (glibc or another libc; callers look up their function)."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's `malloc_trim(0)`); True if it did.

    After a large object freed in pieces (a model session's weights), glibc keeps the freed
    pages of every malloc arena until this is called. It takes a few milliseconds: call it
    after such a release, not on a hot path. Does nothing off glibc."""
    libc = _glibc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    released = bool(trim(0))
    logger.debug("malloc: trimmed the heap: %s", released)
    return released


def fix_mmap_threshold() -> bool:
    """Fix glibc's mmap and trim thresholds (`MMAP_THRESHOLD`, `TRIM_THRESHOLD`); True if both were set.

    Does nothing off glibc, and leaves alone a process whose environment tunes malloc
    itself (`MALLOC_MMAP_THRESHOLD_`, `MALLOC_TRIM_THRESHOLD_`, ...: glibc read them at start).
    """
    if any(name.startswith("MALLOC_") for name in os.environ):
        return False
    mallopt = getattr(_glibc(), "mallopt", None)
    if mallopt is None:  # not Linux, or not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    logger.debug("malloc: mmap and trim thresholds %d and %d bytes: %s", MMAP_THRESHOLD, TRIM_THRESHOLD, done)
    return done
