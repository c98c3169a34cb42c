"""The write gate: inside a program, only tools that say they only read may run, unless allowed.

A program can call a tool ten thousand times in a loop the model never reads, so a tool that
changes something (not annotated `readOnlyHint: true`) is refused inside a program unless the
operator allows it by name: `codemode.allow_writes`, fnmatch globs over exposed names
(`notes__*` for a whole server, `notes__add` for one tool). The refusal says exactly that.
"""

from __future__ import annotations

from collections.abc import Sequence

import mcp_types as types

from gateway.calls.chain import matches_any

__all__ = ["WriteGate", "read_only"]


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
