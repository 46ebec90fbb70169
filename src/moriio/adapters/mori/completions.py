"""Completions of the mori adapter: what mori reported for each batch, and when it is quiet.

A batch is *quiet* once no byte of it can land any more (see
:mod:`moriio.adapters.mori.transfers`). A refusal at post time ("SQ full", "EP is degraded")
becomes BACKPRESSURE, re-posted later by the caller, only when nothing of the batch reached a
send queue (:mod:`~moriio.adapters.mori.posting`); a batch mori left partly posted fails
instead. A message saying the connection's endpoints were retired or broken
(:func:`~moriio.adapters.mori.status.lane_lost`) hands the connection to
``connection_lost(peer, lane, reason)``: transfers move to new queue pairs. A post rejected by
a retired endpoint before anything was posted is BACKPRESSURE too: the re-post goes out on the
new connection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from moriio.adapters.mori import posting
from moriio.adapters.mori.settings import RdmaTuning
from moriio.adapters.mori.status import MoriStatusCode, classify_status, lane_lost
from moriio.adapters.mori.transfers import PARTIAL_POST_NOTE, StatusKeeper, Xfer
from moriio.ports import PeerId, TransferHandle, TransferState, TransferStatus
from moriio.ports.post_checks import known_batch

_IN_PROGRESS = TransferStatus(TransferState.IN_PROGRESS)
_NEW_CONNECTION = "; nothing was posted: the re-post goes out on a new connection"


class Completions:
    """The adapter's posted batches by handle, and the released ones not quiet yet.

    Call with the adapter lock held. ``tuning`` None: XGMI, where a failed copy is final.
    """

    def __init__(
        self, tuning: RdmaTuning | None, connection_lost: Callable[[PeerId, int, str], None]
    ) -> None:
        self._tuning = tuning
        self._connection_lost = connection_lost
        self._xfers: dict[TransferHandle, Xfer] = {}
        self._orphans: list[Xfer] = []  # released, not yet quiet
        self.kept = StatusKeeper()
        self._next_handle = 1

    def add(self, xfer: Xfer) -> TransferHandle:
        handle = TransferHandle(self._next_handle)
        self._next_handle += 1
        self._xfers[handle] = xfer
        return handle

    def get(self, handle: TransferHandle) -> Xfer:
        return known_batch(self._xfers, handle)

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

    def fail_peer(self, peer: PeerId, result: TransferStatus, lane: int | None = None) -> None:
        """Decide every batch to ``peer`` not decided yet as ``result``; with ``lane``, only
        those posted on it (a batch waiting for a connection moves to the new one)."""
        for xfer in self._all():
            if xfer.peer != peer:
                continue
            if lane is None or (xfer.lane == lane and not xfer.waiting):
                xfer.finish(result)

    def settle_post(self, xfer: Xfer, status: Any | None, error: str, now: float) -> None:
        """Record what mori said when the post returned (``status`` None: ``error``)."""
        xfer.posting = False
        if status is None:  # nothing reached the send queue
            xfer.quiet_at = now
            xfer.finish(TransferStatus(TransferState.FAILED, error))
            return
        code = int(status.Code())
        if code in (MoriStatusCode.INIT, MoriStatusCode.IN_PROGRESS, MoriStatusCode.SUCCESS):
            xfer.status = status
            self._observe(xfer, now)
            return
        message = str(status.Message())
        result = classify_status(code, message)
        lost = code == MoriStatusCode.ERR_RDMA_OP and lane_lost(message)
        if lost:
            self._connection_lost(xfer.peer, xfer.lane, message)
        if code != MoriStatusCode.ERR_RDMA_OP or self._refused_before_posting(xfer, message):
            xfer.quiet_at = now
            if lost and result.state is TransferState.FAILED:
                result = TransferStatus(
                    TransferState.BACKPRESSURE, result.message + _NEW_CONNECTION
                )
        else:
            xfer.quiet_at = self._settle_deadline(now)
            if result.state is TransferState.BACKPRESSURE:  # refused after a partial post
                result = TransferStatus(TransferState.FAILED, result.message + PARTIAL_POST_NOTE)
        self.kept.keep(status, xfer.lane, now, xfer.quiet_at)  # posted chains still write it
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
        self.kept.release_due(now)

    def busy_memories(self, now: float) -> set[int]:
        """The local memories some batch that is not quiet yet uses."""
        return {x.mem_id for x in self._all() if not self._quiet(x, now)}

    def posting_lanes(self) -> set[int]:
        """The lanes a mori post runs on now (outside the adapter lock)."""
        return {x.lane for x in self._all() if x.posting}

    def retire_lane(self, lane: int, now: float) -> None:
        """``lane``'s engine was destroyed: its queue pairs went with it, so nothing of its
        batches can land any more, and mori writes none of their statuses again."""
        for xfer in self._all():
            if xfer.lane == lane and not xfer.posting and not xfer.waiting:
                xfer.status, xfer.quiet_at = None, now
                xfer.finish(TransferStatus(TransferState.FAILED, "its connection was closed"))
        self.kept.release_lane(lane)
        self.forget_quiet_orphans(now)

    def clear(self) -> None:
        self._xfers.clear()
        self._orphans.clear()
        self.kept.clear()

    def _all(self) -> Iterable[Xfer]:
        yield from self._xfers.values()
        yield from self._orphans

    def _one_chain(self, xfer: Xfer) -> bool:
        tuning = self._tuning
        if tuning is None:
            return True
        batch = xfer.batch
        return posting.one_chain(tuning, xfer.kind, int(batch.sizes.size), batch.total_bytes)

    def _refused_before_posting(self, xfer: Xfer, message: str) -> bool:
        tuning = self._tuning
        if tuning is None:
            return True
        batch = xfer.batch
        return posting.refused_before_posting(
            tuning, xfer.kind, message, xfer.uid, int(batch.sizes.size), batch.total_bytes
        )

    def _settle_deadline(self, now: float) -> float:
        return now if self._tuning is None else self._tuning.settle_deadline(now)

    def _observe(self, xfer: Xfer, now: float) -> None:
        seen = xfer.observe()
        if seen is None:
            return
        status, code, message = seen
        one = self._one_chain(xfer)
        result = xfer.verdict(code, message, one, self._settle_deadline(now), now)
        self.kept.keep(status, xfer.lane, now, xfer.quiet_at)
        if code == MoriStatusCode.ERR_RDMA_OP:
            self._connection_lost(xfer.peer, xfer.lane, message)
        xfer.finish(result)

    def _quiet(self, xfer: Xfer, now: float) -> bool:
        self._observe(xfer, now)
        return xfer.is_quiet(now)
