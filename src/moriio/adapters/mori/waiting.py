"""Batches of the mori adapter that wait for their connection.

A batch posted before its session exists (the connection thread is still building it, or its
connection was lost and is being rebuilt on a new lane) waits here, IN_PROGRESS with nothing
posted. It is not quiet: it will be posted. When its session is built it is posted from the
connection thread; when the build fails it fails with mori's reason; a cancel, a removed peer
or a closed engine drops it (then it is quiet: nothing of it was ever posted).
"""

from __future__ import annotations

from collections.abc import Callable

from moriio.adapters.mori.connections import SessionKey
from moriio.adapters.mori.peers import PeerTable
from moriio.adapters.mori.transfers import Xfer
from moriio.ports import TransferState, TransferStatus


class Waiting:
    """Waiting batches by the session key they wait for; call with the adapter lock held."""

    def __init__(self) -> None:
        self._by_key: dict[SessionKey, list[Xfer]] = {}

    def add(self, key: SessionKey, xfer: Xfer) -> None:
        xfer.waiting, xfer.lane = True, key[0]
        self._by_key.setdefault(key, []).append(xfer)

    def lanes(self) -> set[int]:
        return {key[0] for key in self._by_key}

    def cancel(self, xfer: Xfer, now: float) -> None:
        """Drop ``xfer`` before anything of it was posted."""
        self._stop(xfer, "cancelled before it was posted", now)
        for key, xfers in list(self._by_key.items()):
            if xfer in xfers:
                xfers.remove(xfer)
                if not xfers:
                    del self._by_key[key]

    def drop(self, doomed: Callable[[SessionKey], bool], now: float) -> None:
        """Drop every batch waiting for a key ``doomed`` selects."""
        for key in [k for k in self._by_key if doomed(k)]:
            for xfer in self._by_key.pop(key):
                self._stop(xfer, "dropped before it was posted: its connection was closed", now)

    def settle(
        self, key: SessionKey, error: str, peers: PeerTable, now: float
    ) -> tuple[list[Xfer], list[SessionKey]]:
        """The session ``key`` was built (``error`` empty) or not: (the batches to post now,
        the keys of the new lanes the rest moved to)."""
        ready: list[Xfer] = []
        moved: list[SessionKey] = []
        for xfer in self._by_key.pop(key, []):
            if xfer.final is not None:
                self._stop(xfer, "", now)
            elif error:
                self._stop(xfer, error, now)
            elif xfer.peer not in peers:
                self._stop(xfer, f"peer {xfer.peer} was removed before the batch was posted", now)
            elif (lane := peers.lane(xfer.peer)) != key[0]:  # the connection broke meanwhile
                new_key = (lane, key[1], key[2], key[3])
                self.add(new_key, xfer)
                moved.append(new_key)
            else:
                xfer.waiting = False
                ready.append(xfer)
        return ready, moved

    @staticmethod
    def _stop(xfer: Xfer, reason: str, now: float) -> None:
        xfer.waiting, xfer.quiet_at = False, now
        xfer.finish(TransferStatus(TransferState.FAILED, reason))
