"""Secrets out of the records: argument values under secret-looking keys, and configured secrets anywhere.

Two nets, because either alone misses something: a key glob (`*password*`, `*_key`,
`authorization`, case-insensitive, at any depth of nested objects and lists) catches a
secret the gateway never heard of, and the server's own configured credentials
(`Upstream.redact`, passed in as `mask`) catch one that a tool echoes back in a value
or a response under an innocent name.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from typing import Any

from gateway.config.servers import MASK
from gateway.records.cut import truncated_arguments

__all__ = ["MASK", "Masker", "Redactor", "no_mask"]

Masker = Callable[[str, str], str]
"""`(server id, text) -> text` with that server's configured secrets replaced by `***`."""


def no_mask(server: str, text: str) -> str:
    return text


class Redactor:
    """Replaces the values of secret-looking keys with `***` in JSON-like data, at any depth."""

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(pattern.lower() for pattern in patterns)
        self._verdicts: dict[str, bool] = {}

    def is_secret(self, key: str) -> bool:
        verdict = self._verdicts.get(key)
        if verdict is None:
            lowered = key.lower()
            verdict = any(fnmatch.fnmatchcase(lowered, pattern) for pattern in self.patterns)
            if len(self._verdicts) < 10_000:  # keys repeat; a flood of new ones must not grow this forever
                self._verdicts[key] = verdict
        return verdict

    def redact(self, value: Any) -> Any:
        """A copy of `value` with the values of secret keys masked; the input is not changed."""
        if isinstance(value, dict):
            return {k: MASK if self.is_secret(str(k)) else self.redact(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.redact(item) for item in value]
        return value

    def arguments_json(self, arguments: dict[str, Any] | None, mask: Callable[[str], str], limit: int) -> str | None:
        """The arguments as stored: redacted, as compact JSON, with configured secrets masked, within
        `limit` bytes (larger ones are cut, their size noted: `gateway.records.cut.truncated_arguments`)."""
        if arguments is None:
            return None
        return truncated_arguments(arguments, limit, self.is_secret, mask)
