"""The `message` events of a server-sent events body, read from its bytes (`gateway.upstreams.lean_post`).

An upstream's SSE answer to a lean request is read straight off the connection rather than through
httpx2's `Response` and `EventSource`. The events are what `httpx2.EventSource` gives (the SSE
rules: lines end in CRLF, LF or CR, even split across reads; `:` starts a comment; one space
after a field's colon is dropped; `data` lines are joined with LF; an event is dispatched at a
blank line, never at the body's end unless a CR ends it), kept to what the lean path reads of
them: the data of each event of type `message` whose data is not empty, as bytes.
"""

from __future__ import annotations

__all__ = ["MessageEvents"]


class MessageEvents:
    """Feed a body's bytes in order (`feed`, then `end`); the data of each `message` event comes back."""

    __slots__ = ("_partial", "_trailing_cr", "_event", "_data")

    def __init__(self) -> None:
        self._partial = b""
        """The start of a line not ended yet."""
        self._trailing_cr = False
        """The bytes fed last ended in CR: a LF first in the next ones belongs to it."""
        self._event = b""
        self._data: list[bytes] = []

    def feed(self, block: bytes) -> list[bytes]:
        if self._trailing_cr:
            block = b"\r" + block
            self._trailing_cr = False
        if block.endswith(b"\r"):
            self._trailing_cr = True
            block = block[:-1]
        if b"\r" in block:
            block = block.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if b"\n" not in block:
            self._partial += block
            return []
        lines = block.split(b"\n")
        lines[0] = self._partial + lines[0]
        self._partial = lines.pop()
        return self._lines(lines)

    def end(self) -> list[bytes]:
        """The body ended: what a CR at its very end dispatches."""
        if not self._trailing_cr:
            return []  # an unfinished line, or event, is dropped
        self._trailing_cr = False
        lines = [self._partial, b""]
        self._partial = b""
        return self._lines(lines)

    def _lines(self, lines: list[bytes]) -> list[bytes]:
        out: list[bytes] = []
        for line in lines:
            if not line:
                if self._event or self._data:
                    data = b"\n".join(self._data)
                    if data and self._event in (b"", b"message"):
                        out.append(data)
                    self._event, self._data = b"", []
                continue
            if line[0] == 58:  # ":", a comment
                continue
            name, _, value = line.partition(b":")
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value)
            elif name == b"event":
                self._event = value
        return out
