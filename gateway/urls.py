"""Database URLs as they may be shown in logs, errors and reports: never with their password."""

from __future__ import annotations

import re

__all__ = ["redact_url"]

_PASSWORD = re.compile(r"^([a-z][a-z0-9+.-]*://[^:/@]*):[^@/]*@", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with its password replaced by `***` (text that does not start with a URL: unchanged)."""
    return _PASSWORD.sub(r"\1:***@", url)
