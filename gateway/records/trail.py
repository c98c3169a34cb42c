"""Which search a call followed: the last search of the same session (or caller) that returned the tool.

Bounded in memory (at most `max_keys` sessions or callers, the last `per_key` searches
each, least recently used out first) and in time (a search older than `window`
seconds explains no call).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence

__all__ = ["SearchTrail"]


class SearchTrail:
    def __init__(
        self,
        *,
        max_keys: int = 10_000,
        per_key: int = 16,
        window: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_keys, self.per_key, self.window, self.clock = max_keys, per_key, window, clock
        self._searches: OrderedDict[str, deque[tuple[float, str, frozenset[str]]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._searches)

    def add(self, keys: Sequence[str], search_id: str, tools: Iterable[str]) -> None:
        """Remember a search under each key (the session's and the caller's)."""
        entry = (self.clock(), search_id, frozenset(tools))
        for key in keys:
            found = self._searches.get(key)
            if found is None:
                found = self._searches[key] = deque(maxlen=self.per_key)
            else:
                self._searches.move_to_end(key)
            found.append(entry)
        while len(self._searches) > self.max_keys:
            self._searches.popitem(last=False)

    def find(self, keys: Sequence[str], tool: str) -> str | None:
        """The id of the most recent recent-enough search under the first key that has one returning `tool`."""
        oldest = self.clock() - self.window
        for key in keys:
            for at, search_id, tools in reversed(self._searches.get(key, ())):
                if at < oldest:
                    break
                if tool in tools:
                    return search_id
        return None
