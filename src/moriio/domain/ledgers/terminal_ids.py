"""Bounded memory of finished transfer ids, so late messages for them are recognised."""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_TERMINAL_CAPACITY = 4096


class TerminalIds:
    """An LRU set of transfer ids that reached a terminal state.

    Holds at most ``capacity`` ids; adding more evicts the least recently added and counts it
    in :attr:`evictions` (a late message for an evicted id is then treated as unknown).
    """

    def __init__(self, capacity: int = DEFAULT_TERMINAL_CAPACITY) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"terminal capacity must be a positive int, got {capacity!r}")
        self._capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        self.evictions = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, transfer_id: object) -> bool:
        return transfer_id in self._ids

    def add(self, transfer_id: str) -> None:
        """Remember ``transfer_id`` as terminal (refreshing it if already known)."""
        self._ids[transfer_id] = None
        self._ids.move_to_end(transfer_id)
        if len(self._ids) > self._capacity:
            self._ids.popitem(last=False)
            self.evictions += 1
