"""Each upstream's supervisor task in its own cancel scope, so that one can be added, stopped or
replaced while the others keep their sessions; and the diff of two sets of specs by server id.

The registry (`gateway.registry`) owns one `Supervisors` while it runs. Stopping one upstream
asks it to stop (its session is closed and a stdio child reaped, as at shutdown), waits a
bounded time, then cancels its scope: a server that will not go away cannot hold up the rest.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import anyio
import anyio.abc

from gateway.upstreams.spec import UpstreamSpec
from gateway.upstreams.upstream import Upstream

__all__ = ["STOP_GRACE_SECONDS", "SpecChanges", "Supervisors", "diff_specs", "same_spec"]

logger = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 10.0
"""How long a stopping upstream may take to close its session before its task is cancelled."""


@dataclass(frozen=True)
class SpecChanges:
    """What `Registry.apply_specs` did, by server id."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()


def same_spec(a: UpstreamSpec, b: UpstreamSpec) -> bool:
    """Whether two specs start the same server the same way.

    A spec's `tool_filter` is a bound method of the YAML entry's `ToolFilter`; bound methods
    compare their objects by identity, so the filters are compared by value here. A plugin's
    in-memory server object compares by identity: a re-registered plugin server is a new one.
    """
    return _comparable(a) == _comparable(b)


def _comparable(spec: UpstreamSpec) -> tuple[UpstreamSpec, object]:
    tool_filter = spec.tool_filter
    return dataclasses.replace(spec, tool_filter=None), getattr(tool_filter, "__self__", tool_filter)


def diff_specs(running: Mapping[str, UpstreamSpec], specs: Sequence[UpstreamSpec]) -> SpecChanges:
    """Compare the running specs with new ones, by server id (in the new order, removed ones last)."""
    new = {spec.id: spec for spec in specs}
    added = tuple(i for i in new if i not in running)
    removed = tuple(i for i in running if i not in new)
    changed = tuple(i for i in new if i in running and not same_spec(running[i], new[i]))
    unchanged = tuple(i for i in new if i in running and same_spec(running[i], new[i]))
    return SpecChanges(added=added, removed=removed, changed=changed, unchanged=unchanged)


@dataclass
class _Slot:
    upstream: Upstream
    scope: anyio.CancelScope
    done: anyio.Event


class Supervisors:
    """The supervisor tasks of the running upstreams, each in its own cancel scope."""

    def __init__(self, task_group: anyio.abc.TaskGroup) -> None:
        self.task_group = task_group
        self._slots: dict[int, _Slot] = {}
        """Keyed by the upstream object: an upstream being replaced and its successor share an id."""

    def __len__(self) -> int:
        return len(self._slots)

    def start(self, upstream: Upstream) -> None:
        """Run `upstream.run()` until it returns or `stop` is called for it."""
        slot = _Slot(upstream, anyio.CancelScope(), anyio.Event())
        self._slots[id(upstream)] = slot
        self.task_group.start_soon(self._run, slot, name=f"upstream {upstream.id}")

    async def _run(self, slot: _Slot) -> None:
        try:
            with slot.scope:
                await slot.upstream.run()
        finally:
            slot.done.set()
            self._slots.pop(id(slot.upstream), None)

    async def stop(self, upstream: Upstream, because: str, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop one upstream (`because`: the reason its `stopped` state gives) and wait until its task has
        ended (its session closed, a child reaped)."""
        slot = self._slots.get(id(upstream))
        upstream.stop(because)
        if slot is None:  # never started, or already over
            return
        with anyio.move_on_after(grace):
            await slot.done.wait()
        if not slot.done.is_set():
            logger.warning("server %r did not stop within %g s; cancelling it", upstream.id, grace)
            slot.scope.cancel()
            await slot.done.wait()

    def stop_all(self) -> None:
        """Ask every upstream to stop (at the end of `Registry.running`, whose deadline bounds the rest)."""
        for slot in list(self._slots.values()):
            slot.upstream.stop()
