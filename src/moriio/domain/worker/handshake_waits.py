"""Reads parked until a handshake with their producer settles, each with a deadline.

A read to a peer not handshaken yet never blocks the worker: it waits here while the
handshake runs in the background, and is resumed (or refused) when it settles, or refused
when its own deadline passes first.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from moriio.domain.timing.deadlines import DeadlineQueue
from moriio.ports import PeerAddress

T = TypeVar("T")


class HandshakeWaits(Generic[T]):
    """Parked items by transfer id, grouped by the peer address they wait for."""

    def __init__(self) -> None:
        self._items: dict[str, tuple[PeerAddress, T]] = {}
        self._by_address: dict[PeerAddress, list[str]] = {}
        self._deadlines: DeadlineQueue[str] = DeadlineQueue()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, transfer_id: object) -> bool:
        return transfer_id in self._items

    def transfer_ids(self) -> tuple[str, ...]:
        return tuple(self._items)

    def park(self, transfer_id: str, address: PeerAddress, item: T, deadline: float) -> None:
        if transfer_id in self._items:
            raise ValueError(f"transfer {transfer_id!r} is parked already")
        self._items[transfer_id] = (address, item)
        self._by_address.setdefault(address, []).append(transfer_id)
        self._deadlines.set(transfer_id, deadline)

    def take(self, address: PeerAddress) -> list[T]:
        """Everything waiting for ``address``, in parking order; removed."""
        taken = []
        for tid in self._by_address.pop(address, ()):
            entry = self._items.pop(tid, None)
            if entry is not None:
                self._deadlines.discard(tid)
                taken.append(entry[1])
        return taken

    def expire(self, now: float) -> list[T]:
        """Items whose deadline passed; removed."""
        expired = []
        for tid in self._deadlines.pop_due(now):
            address, item = self._items.pop(tid)
            waiting = self._by_address.get(address)
            if waiting is not None:
                waiting.remove(tid)
                if not waiting:
                    del self._by_address[address]
            expired.append(item)
        return expired
