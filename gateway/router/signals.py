"""What the router learns from use: the shared vocabulary of the records store and the router.

The records store (`gateway.records`) turns executions and feedback into `UsageSignal`s;
the router's learning (`gateway.router.learning`) turns signals into bounded, decaying
score adjustments. Neither side imports the other: both speak these types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["SignalKind", "SignalSource", "UsageSignal", "feedback_value"]

SignalKind = Literal["call", "feedback"]


@dataclass(frozen=True)
class UsageSignal:
    """One thing learnt from use: after `query`, `tool` was called and worked or failed, or was rated.

    `value` is in -1..1: +1 for a call that succeeded after the search or a thumbs-up,
    -1 for a call that failed (error or timeout) or a thumbs-down, `(score - 3) / 2` for a
    1-5 score. `query` is None when the call or rating is not tied to a search (a tool
    called by name): such signals say something about the tool for every query.
    """

    query: str | None
    tool: str
    """The exposed tool name, `prefix__tool`."""
    value: float
    at: float
    """When it happened, in Unix seconds (signals decay with age)."""
    kind: SignalKind


@runtime_checkable
class SignalSource(Protocol):
    """Where the router reads signals from: the records (`gateway.records.Records`, over SQLite or PostgreSQL).

    A source may also offer `signal_horizon() -> float`: a time before which no signal can still
    reach it; the router then re-reads only from there (`gateway.router.service.SignalCursor`)."""

    async def usage_signals(self, since: float | None = None) -> Sequence[UsageSignal]:
        """Signals that happened at or after `since` (Unix seconds), oldest first; all when None."""
        ...


def feedback_value(rating: Literal["up", "down"] | None, score: int | None) -> float:
    """A rating and/or a 1-5 score as one value in -1..1 (the score wins when both are given)."""
    if score is not None:
        if not 1 <= score <= 5:
            raise ValueError(f"score must be 1 to 5, not {score}")
        return (score - 3) / 2
    if rating == "up":
        return 1.0
    if rating == "down":
        return -1.0
    raise ValueError("feedback needs a rating ('up' or 'down') or a score (1-5)")
