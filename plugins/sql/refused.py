"""The SQL tools' refusal of a piece of SQL, apart from the parser that decides it.

Kept out of `classify` so that importing the plugin does not import sqlglot (about 8 MB of an
idle gateway, docs/benchmarks.md "Memory"): the parser loads on the first statement classified.
"""

from __future__ import annotations

__all__ = ["SqlRefused"]


class SqlRefused(ValueError):
    """The input cannot be parsed, or the policy above refuses it; the message says which and why."""
