"""The write gate: inside a program, only tools that say they only read may run, unless allowed.

A program can call a tool ten thousand times in a loop the model never reads, so a tool that
changes something (not annotated `readOnlyHint: true`) is refused inside a program unless the
operator allows it by name: `codemode.allow_writes`, fnmatch globs over exposed names
(`notes__*` for a whole server, `notes__add` for one tool), or the client's user allows it for
one run: with `codemode.confirm_writes` on, a client that can be asked (elicitation) is asked
once per run, at the run's first write call the config does not allow, and its yes lets that
run call every write tool it may see. The refusal says how to allow it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import anyio
import mcp_types as types

from gateway.calls.chain import matches_any

__all__ = ["ConfirmWrites", "RunWrites", "WriteGate", "read_only"]

ConfirmWrites = Callable[[str], Awaitable[bool]]
"""Asks the client whether this run may call write tools (naming the first one); True: it may."""


def read_only(tool: types.Tool) -> bool:
    """Whether a tool says it only reads (`annotations.readOnlyHint: true`)."""
    return tool.annotations is not None and tool.annotations.read_only_hint is True


class WriteGate:
    """Which tools a program may call: the read-only ones, and those `allow_writes` names."""

    def __init__(self, allow_writes: Sequence[str]) -> None:
        self.allow_writes = list(allow_writes)

    def refusal(self, name: str, tool: types.Tool) -> str | None:
        """Why a program may not call `tool` (exposed as `name`), saying how to allow it; None: it may."""
        if read_only(tool) or matches_any(name, self.allow_writes):
            return None
        prefix = name.partition("__")[0]
        return (
            f"{name} may change something (it is not annotated readOnlyHint: true), and programs may call only "
            f"read-only tools. To allow it, the gateway's operator adds it to GATEWAY_CODEMODE__ALLOW_WRITES, "
            f"e.g. '[\"{name}\"]' for this tool or '[\"{prefix}__*\"]' for its whole server."
        )


class RunWrites:
    """The write gate of one program run: the config's answer, else the client's, asked once.

    `confirm` is None when the client cannot be asked (no elicitation, a 2026-07-28 client,
    stateless HTTP) or `confirm_writes` is off. The first write call the config refuses asks;
    concurrent calls wait for that one answer; later calls reuse it.
    """

    def __init__(self, gate: WriteGate, confirm: ConfirmWrites | None, *, confirm_writes: bool) -> None:
        self.gate = gate
        self.confirm = confirm
        self.confirm_writes = confirm_writes
        self.allowed_by_client: bool | None = None
        """The client's answer for this run; None: not asked (yet)."""
        self._asking = anyio.Lock()

    async def refusal(self, name: str, tool: types.Tool) -> str | None:
        """Why this run may not call `tool` (exposed as `name`), saying how to allow it; None: it may."""
        refusal = self.gate.refusal(name, tool)
        if refusal is None:
            return None
        if not self.confirm_writes:
            return refusal
        if self.confirm is None:
            return (
                f"{refusal} Or use a client that supports elicitation over a connection that can carry a request "
                "from the gateway (stdio, or HTTP with sessions, not a 2026-07-28 client): it is asked once per run."
            )
        async with self._asking:
            if self.allowed_by_client is None:
                self.allowed_by_client = await self.confirm(name)
        if self.allowed_by_client:
            return None
        return f"{refusal} The client was asked once for this run and did not allow write tools."
