"""A WRITE producer rank's pushes of one transfer, and when the request's blocks go free.

A producer rank writes into each consumer rank of its group (:func:`consumer_group`): one
rank when the consumer's TP size is not larger, several (each its share of the heads or
state, under a share id of its own, see :mod:`moriio.domain.params.share_ids`) when it is.
The request's blocks are reported free once every share ended and the scheduler handed the
blocks over (its hold): never while one share may still read them, and exactly once.
"""

from __future__ import annotations

from moriio.domain.kv.shards import consumer_group
from moriio.domain.params.orders import SaveOrder
from moriio.domain.params.share_ids import share_transfer_id


class PushShares:
    """Share ids by transfer, and per request the shares not yet both ended and held."""

    def __init__(self) -> None:
        self._ids: dict[str, tuple[str, ...]] = {}  # transfer id -> its share ids (several)
        self._request_of: dict[str, str] = {}  # transfer id with shares -> request id
        self._left: dict[str, int] = {}  # request id -> shares not yet ended and held
        self._held: dict[str, str] = {}  # share id -> request id: blocks handed over
        self._ended_unheld: dict[str, str] = {}  # share id -> request id: ended, not held

    def split(self, order: SaveOrder, tp_rank: int, tp_size: int) -> list[tuple[SaveOrder, int]]:
        """``order`` as one order per consumer rank it writes (with that rank)."""
        peer_tp = (order.peer.tp_size if order.peer is not None else 0) or tp_size
        try:
            ranks = consumer_group(tp_rank, tp_size, peer_tp)
        except ValueError:  # sizes that do not pair: the consumer releases, nothing is written
            ranks = range(tp_rank % peer_tp, tp_rank % peer_tp + 1)
        count = len(ranks)
        if count == 1:
            return [(order, ranks.start)]
        ids = tuple(share_transfer_id(order.transfer_id, k, count) for k in range(count))
        self._ids[order.transfer_id] = ids
        self._request_of[order.transfer_id] = order.request_id
        self._left[order.request_id] = count
        return [
            (order._replace(transfer_id=share), rank)
            for share, rank in zip(ids, ranks, strict=True)
        ]

    def ids(self, transfer_id: str) -> tuple[str, ...]:
        """The share ids of ``transfer_id`` (itself when it has one push)."""
        return self._ids.get(transfer_id, (transfer_id,))

    def hold(self, transfer_id: str, request_id: str) -> bool:
        """The scheduler handed ``transfer_id``'s blocks over; True when the request's blocks
        may be reported free now (its last share had ended already)."""
        finished = False
        for share in self.ids(transfer_id):
            if self._ended_unheld.pop(share, None) is not None:
                finished |= self._last(request_id)
            else:
                self._held[share] = request_id
        return finished

    def unhold(self, share_id: str) -> None:
        """The scheduler reclaimed the blocks: the share no longer waits for them."""
        self._held.pop(share_id, None)

    def ended(self, share_id: str, request_id: str, reclaimed: bool) -> bool:
        """A share ended; True when it was the request's last (its blocks may be reported
        free, unless the scheduler reclaimed them: ``reclaimed``)."""
        if self._held.pop(share_id, None) is None and not reclaimed:
            self._ended_unheld[share_id] = request_id
            return False
        return self._last(request_id)

    def _last(self, request_id: str) -> bool:
        """Count one share of ``request_id`` done; True when it was the last."""
        left = self._left.get(request_id, 1) - 1
        if left > 0:
            self._left[request_id] = left
            return False
        self._left.pop(request_id, None)
        for tid in [t for t, r in self._request_of.items() if r == request_id]:
            del self._request_of[tid]
            self._ids.pop(tid, None)
        return True
