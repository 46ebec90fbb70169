"""Completion bookkeeping of the mori adapter: what mori reported, and when a batch is quiet."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from moriio.adapters.mori.connections import Connections, Memory
from moriio.adapters.mori.status import MoriStatusCode, classify_status
from moriio.adapters.mori.transfers import PARTIAL_POST_NOTE, SETTLE_SECONDS, Xfer
from moriio.ports import TransferHandle, TransferState, TransferStatus


class Settling(Connections):
    """The completion half of :class:`~moriio.adapters.mori.MoriTransferEngine`."""

    _xfers: dict[TransferHandle, Xfer]
    _orphans: list[Xfer]  # released, not yet quiet
    _doomed: dict[int, Memory]  # no region left in it, waiting for quiet transfers
    _retained: list[Any]  # failed statuses mori may still write, until close

    def _all_xfers(self) -> Iterable[Xfer]:
        yield from self._xfers.values()
        yield from self._orphans

    def _settle_post(self, xfer: Xfer, status: Any | None, error: str, now: float) -> None:
        """Record what mori said when the post returned."""
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
            if result.state is TransferState.BACKPRESSURE:
                result = TransferStatus(TransferState.FAILED, result.message + PARTIAL_POST_NOTE)
            elif "ibv_post_send" in message:
                self._connection_lost(xfer.peer, xfer.lane, message)
        xfer.finish(result)

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

    def _reap(self, now: float) -> None:
        """Forget quiet orphans; hand back to mori, once per lane, each doomed memory nothing
        can land in any more."""
        if self._orphans:
            self._orphans = [x for x in self._orphans if not self._quiet(x, now)]
        if not self._doomed:
            return
        busy = {x.mem_id for x in self._all_xfers() if not self._quiet(x, now)}
        for mem_id in [m for m in self._doomed if m not in busy]:
            del self._doomed[mem_id]
            for lane in self._lanes.values():
                desc = lane.locals.pop(mem_id, None)
                if desc is not None:
                    lane.engine.deregister_memory(desc)
