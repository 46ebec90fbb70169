"""Completions of the mori adapter: what mori reported for each batch, and when it is quiet.

A batch is *quiet* once no byte of it can land any more (see
:mod:`moriio.adapters.mori.transfers`). mori's "SQ full" (the RDMA send queue had no room
for the post) becomes BACKPRESSURE, re-posted later by the caller, only when nothing of the
batch reached the queue: one post chain
(:meth:`~moriio.adapters.mori.settings.RdmaTuning.single_chain`). A batch mori
split into several chains may be partly posted, so "SQ full" fails it instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from moriio.adapters.mori.status import MoriStatusCode, classify_status
from moriio.adapters.mori.transfers import PARTIAL_POST_NOTE, SETTLE_SECONDS, Xfer
from moriio.ports import PeerId, TransferHandle, TransferState, TransferStatus
from moriio.ports.post_checks import known_batch

_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)


class Completions:
    """The adapter's posted batches by handle, and the released ones not quiet yet.

    Call with the adapter lock held. A completion that says the connection broke is handed to
    ``connection_lost(peer, lane, reason)``.
    """

    def __init__(self, connection_lost: Callable[[PeerId, int, str], None]) -> None:
        self._connection_lost = connection_lost
        self._xfers: dict[TransferHandle, Xfer] = {}
        self._orphans: list[Xfer] = []  # released, not yet quiet
        self._retained: list[Any] = []  # failed statuses mori may still write, until close
        self._next_handle = 1

    def add(self, xfer: Xfer) -> TransferHandle:
        handle = TransferHandle(self._next_handle)
        self._next_handle += 1
        self._xfers[handle] = xfer
        return handle

    def check_known(self, handle: TransferHandle) -> None:
        known_batch(self._xfers, handle)

    def status(self, handle: TransferHandle, now: float) -> TransferStatus:
        xfer = known_batch(self._xfers, handle)
        self._observe(xfer, now)
        return _IN_PROGRESS if xfer.final is None else xfer.final

    def settled(self, handle: TransferHandle, now: float) -> bool:
        return self._quiet(known_batch(self._xfers, handle), now)

    def release(self, handle: TransferHandle, now: float) -> None:
        """Forget ``handle``; a batch not quiet yet is still watched until it is."""
        xfer = self._xfers.pop(handle, None)
        if xfer is not None and not self._quiet(xfer, now):
            self._orphans.append(xfer)

    def fail_peer(self, peer: PeerId, result: TransferStatus) -> None:
        """Decide every batch to ``peer`` not decided yet as ``result``."""
        for xfer in self._xfers.values():
            if xfer.peer == peer:
                xfer.finish(result)

    def settle_post(self, xfer: Xfer, status: Any | None, error: str, now: float) -> None:
        """Record what mori said when the post returned (``status`` None: ``error``)."""
        xfer.posting = False
        if status is None:  # nothing reached the send queue
            xfer.quiet_at = now
            xfer.finish(TransferStatus(TransferState.FAILED, error))
            return
        xfer.status = status
        code = int(status.Code())
        if code in (MoriStatusCode.INIT, MoriStatusCode.IN_PROGRESS, MoriStatusCode.SUCCESS):
            self._observe(xfer, now)
            return
        xfer.status = None
        message = str(status.Message())
        result = classify_status(code, message)
        if code != MoriStatusCode.ERR_RDMA_OP or (
            result.state is TransferState.BACKPRESSURE and xfer.single_chain
        ):
            xfer.quiet_at = now  # refused before anything was posted
        else:
            self._retained.append(status)  # posted chains keep mori's pointer to it
            xfer.quiet_at = now + SETTLE_SECONDS
            if result.state is TransferState.BACKPRESSURE:  # SQ full after a partial post
                result = TransferStatus(TransferState.FAILED, result.message + PARTIAL_POST_NOTE)
            elif "ibv_post_send" in message:
                self._connection_lost(xfer.peer, xfer.lane, message)
        xfer.finish(result)

    def quiet(self, now: float, region_id: int | None, peer: PeerId | None) -> bool:
        """Whether every batch (released or not) from ``region_id`` and/or to ``peer`` is
        quiet; both None: every batch."""
        for xfer in self._all():
            if region_id is not None and xfer.local_id != region_id:
                continue
            if peer is not None and xfer.peer != peer:
                continue
            if not self._quiet(xfer, now):
                return False
        return True

    def forget_quiet_orphans(self, now: float) -> None:
        if self._orphans:
            self._orphans = [x for x in self._orphans if not self._quiet(x, now)]

    def busy_memories(self, now: float) -> set[int]:
        """The local memories some batch that is not quiet yet uses."""
        return {x.mem_id for x in self._all() if not self._quiet(x, now)}

    def clear(self) -> None:
        self._xfers.clear()
        self._orphans.clear()
        self._retained.clear()

    def _all(self) -> Iterable[Xfer]:
        yield from self._xfers.values()
        yield from self._orphans

    def _observe(self, xfer: Xfer, now: float) -> None:
        seen = xfer.observe(now)
        if seen is None:
            return
        code, result = seen
        if code == MoriStatusCode.ERR_RDMA_OP:
            self._connection_lost(xfer.peer, xfer.lane, result.message)
        xfer.finish(result)

    def _quiet(self, xfer: Xfer, now: float) -> bool:
        self._observe(xfer, now)
        return xfer.is_quiet(now)
