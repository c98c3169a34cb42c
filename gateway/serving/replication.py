"""A replica follows its deployment's shared state (`gateway.state`), so any replica answers alike.

`follow` applies what the database holds before the replica serves (runtime disables of servers
and tools), then runs the change bus: an approval re-vets the catalog, a disable or enable on
another replica is applied here, a logout ends the cached session, and a `flush` request (feedback
arriving for a call another replica has not written yet) writes this replica's buffered records
at once.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import anyio
from anyio.abc import TaskStatus

from gateway.serving.admin.access import console_for
from gateway.state.database import SharedStateError

if TYPE_CHECKING:
    from gateway.serving.server import GatewayServer
    from gateway.state.deployment import SharedState

__all__ = ["apply_server_disables", "follow"]

logger = logging.getLogger(__name__)


async def apply_server_disables(gateway: GatewayServer, shared: SharedState) -> None:
    """Disable and enable servers here as the deployment's table says."""
    wanted = set(await anyio.to_thread.run_sync(shared.switches.disabled, "servers"))
    registry = gateway.registry
    for server_id in list(registry.upstreams):
        disabled_here = server_id in registry.servers.operator_disabled
        if disabled_here != (server_id in wanted):
            logger.info(
                "server %r is %s by an operator on another replica",
                server_id,
                "disabled" if server_id in wanted else "enabled",
            )
            await registry.set_server_enabled(server_id, server_id not in wanted)


async def follow(
    gateway: GatewayServer, shared: SharedState, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """Catch up with the shared state, report started, then apply every change until cancelled."""
    console = console_for(gateway)
    switches = console.switches
    assert switches is not None

    async def flush() -> None:
        records = gateway.records
        if records is not None and records.writer.pending:
            await records.flush()

    shared.bus.subscribe("approvals", gateway.registry.revet)
    shared.bus.subscribe("tools", switches.refresh)
    shared.bus.subscribe("servers", lambda: apply_server_disables(gateway, shared))
    shared.bus.subscribe("sessions", console.forget_ended)
    shared.bus.subscribe("flush", flush)
    if gateway.records is not None:
        gateway.records.ask_peers_to_flush = lambda: _ask_to_flush(shared)
    try:
        await apply_server_disables(gateway, shared)
        await switches.refresh()
    except SharedStateError as error:
        logger.warning("shared state: could not catch up at start (retried on the next resync): %s", error)
    task_status.started()
    await shared.bus.run()


def _ask_to_flush(shared: SharedState) -> None:
    """Never raises: the other replicas write on their flush interval anyway."""
    try:
        shared.bus.publish("flush")
    except SharedStateError as error:
        logger.warning("feedback: could not ask the other replicas to flush: %s", error)
