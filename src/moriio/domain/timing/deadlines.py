"""A deadline index: set, move or drop a key's deadline; pop the keys that are due.

Costs O(log n) per change and O(due) per :meth:`DeadlineQueue.pop_due`, so callers never
scan every live entry to find the expired ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_COMPACT_SLACK = 64


class DeadlineQueue(Generic[K]):
    """Keys with a deadline each; a key is due once ``now >= deadline``.

    A heap with lazy deletion: moved or dropped keys leave stale heap entries that are
    skipped when popped and compacted away when they outnumber the live ones.
    """

    def __init__(self) -> None:
        self._current: dict[K, tuple[float, int]] = {}
        self._heap: list[tuple[float, int, K]] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._current)

    def __contains__(self, key: object) -> bool:
        return key in self._current

    def deadline(self, key: K) -> float | None:
        """The key's deadline, or None if it has none."""
        entry = self._current.get(key)
        return None if entry is None else entry[0]

    def set(self, key: K, deadline: float) -> None:
        """Give ``key`` the deadline ``deadline`` (replacing any earlier one)."""
        self._seq += 1
        self._current[key] = (deadline, self._seq)
        heapq.heappush(self._heap, (deadline, self._seq, key))
        self._maybe_compact()

    def discard(self, key: K) -> None:
        """Forget ``key``'s deadline; no-op if it has none."""
        if self._current.pop(key, None) is not None:
            self._maybe_compact()

    def next_deadline(self) -> float | None:
        """The earliest live deadline, or None when empty."""
        self._drop_stale_top()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[K]:
        """Remove and return the keys whose deadline is ``<= now``, earliest first."""
        due: list[K] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            deadline, seq, key = heapq.heappop(heap)
            if self._current.get(key) == (deadline, seq):
                del self._current[key]
                due.append(key)
        return due

    def _drop_stale_top(self) -> None:
        heap = self._heap
        while heap:
            deadline, seq, key = heap[0]
            if self._current.get(key) == (deadline, seq):
                return
            heapq.heappop(heap)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self._current) + _COMPACT_SLACK:
            self._heap = [(d, s, k) for k, (d, s) in self._current.items()]
            heapq.heapify(self._heap)
