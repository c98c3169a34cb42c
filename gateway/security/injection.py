"""Scan tool descriptions for prompt-injection patterns (pure functions, no I/O).

A tool description goes straight into the model's context, so a hostile server can
write instructions there ("tool poisoning"). The scanner looks for five kinds:

- `instruction`: text addressed to the model ("ignore previous instructions",
  "do not tell the user", "before using this tool you must ...");
- `hidden_block`: `<IMPORTANT>`-style tags and HTML comments, where such text hides;
- `invisible_unicode`: zero-width, bidi-override and tag characters (category Cf),
  which hide text from a person reading the description;
- `cross_tool`: references to other servers' tools (shadowing: "when send_email is
  called, also ..."), and "instead of / rather than ... tool" phrasing;
- `secret_access`: requests to read secrets or files (~/.ssh, id_rsa, .env,
  credentials, /etc/passwd ...).

`strip_findings` removes what was found (whole sentences for the textual kinds), for
the `strip` policy. Patterns are heuristics: they catch the known shapes, not every
possible attack; `docs/security.md` says what the other defences are.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Collection
from dataclasses import dataclass

__all__ = ["KINDS", "Finding", "scan", "strip_findings"]

KINDS = ("instruction", "hidden_block", "invisible_unicode", "cross_tool", "secret_access")

_I = re.IGNORECASE | re.DOTALL
_INSTRUCTIONS = [
    re.compile(p, _I)
    for p in (
        r"\b(ignore|disregard|forget|override)\b[^.\n]{0,30}\b(previous|prior|above|earlier|all|other|system)\b"
        r"[^.\n]{0,20}\b(instructions?|prompts?|messages?|rules|directions)\b",
        r"\b(do not|don't|never)\s+(tell|inform|mention|reveal|show|notify|alert)\b[^.\n]{0,30}\b(user|human)\b",
        r"\bwithout\s+(telling|informing|notifying|alerting|asking)\s+(the\s+)?(user|human)\b",
        r"\b(before|after)\s+(using|calling|running)\s+(this|any|the)\s+tool\b[^.\n]{0,40}\b(must|always|first|read)\b",
        r"\b(you|the\s+(assistant|model|ai|agent|llm))\s+(must|should|shall|need\s+to)\s+(always|never|first|also)\b",
        r"\b(system\s+prompt|new\s+instructions|this\s+is\s+an?\s+implementation\s+detail)\b",
        r"\byou\s+are\s+now\b",
    )
]
_HIDDEN_BLOCKS = [
    re.compile(
        r"<\s*(important|system|instructions?|secret|hidden|admin|critical|note-to-ai|assistant)\b[^>]*>"
        r".*?(<\s*/\s*\1\s*>|$)",
        _I,
    ),
    re.compile(r"<!--.*?(-->|$)", _I),
]
_SECRETS = [
    re.compile(p, _I)
    for p in (
        r"~/\.ssh\b|\.ssh/|\bid_(rsa|dsa|ecdsa|ed25519)\b",
        r"(^|[\s'\"`(/~])\.env\b",
        r"\.aws/credentials|\.netrc\b|\.npmrc\b|\.pgpass\b|\.kube/config|/etc/(passwd|shadow)\b",
        r"\bcredentials?\.(json|ya?ml|txt)\b|\bmcp\.json\b|claude_desktop_config",
        r"\b(read|send|include|pass|upload|copy|cat|exfiltrate)\b[^.\n]{0,40}"
        r"\b(private\s+keys?|api[\s_-]?keys?|secrets?|passwords?|access\s+tokens?|credentials)\b",
    )
]
_SHADOWING = re.compile(r"\b(instead\s+of|rather\s+than|replaces?|overrides?|shadows?)\b[^.\n]{0,40}\btools?\b", _I)
_SENTENCE_END = re.compile(r"[.!?](\s|$)|\n")


@dataclass(frozen=True)
class Finding:
    """One match: its kind, where it is in the description, and a short excerpt to show."""

    kind: str
    start: int
    end: int
    excerpt: str

    def describe(self) -> str:
        return f"{self.kind}: {self.excerpt!r}"


def _excerpt(text: str, start: int, end: int, width: int = 60) -> str:
    snippet = text[start:end]
    visible = "".join(c if unicodedata.category(c) != "Cf" else f"<U+{ord(c):04X}>" for c in snippet)
    return visible if len(visible) <= width else visible[: width - 3] + "..."


def scan(description: str, other_tools: Collection[str] = ()) -> list[Finding]:
    """Every finding in `description`, in order. `other_tools`: names of *other* servers' tools."""
    found: list[Finding] = []

    def add(kind: str, start: int, end: int) -> None:
        found.append(Finding(kind, start, end, _excerpt(description, start, end)))

    for pattern in _HIDDEN_BLOCKS:
        for match in pattern.finditer(description):
            add("hidden_block", match.start(), match.end())
    for pattern in _INSTRUCTIONS:
        for match in pattern.finditer(description):
            add("instruction", match.start(), match.end())
    for pattern in _SECRETS:
        for match in pattern.finditer(description):
            add("secret_access", match.start(), match.end())
    for match in _SHADOWING.finditer(description):
        add("cross_tool", match.start(), match.end())
    for name in sorted(set(other_tools)):
        # Distinctive names only (no common words), and a substring test before any regex.
        if len(name) >= 4 and ("_" in name or "-" in name) and name in description:
            for match in re.finditer(rf"(?<![\w-]){re.escape(name)}(?![\w-])", description):
                add("cross_tool", match.start(), match.end())
    for index, char in enumerate(description):
        if unicodedata.category(char) == "Cf":
            add("invisible_unicode", index, index + 1)
    return sorted(found, key=lambda f: (f.start, f.kind))


def strip_findings(description: str, findings: Collection[Finding]) -> str:
    """The description without what was found: blocks and invisible characters cut, and the
    whole sentence around any other finding dropped."""
    cut: list[tuple[int, int]] = []
    for finding in findings:
        if finding.kind in ("hidden_block", "invisible_unicode"):
            cut.append((finding.start, finding.end))
        else:
            cut.append(_sentence_around(description, finding.start, finding.end))
    kept: list[str] = []
    position = 0
    for start, end in sorted(cut):
        if start > position:
            kept.append(description[position:start])
        position = max(position, end)
    kept.append(description[position:])
    return re.sub(r"[ \t]{2,}", " ", "".join(kept)).strip()


def _sentence_around(text: str, start: int, end: int) -> tuple[int, int]:
    begin = 0
    for match in _SENTENCE_END.finditer(text, 0, start):
        begin = match.end()
    after = _SENTENCE_END.search(text, end)
    return begin, after.end() if after else len(text)
