"""Bookkeeping of one posted batch: its mori status, its port state, and when it is quiet.

mori has no cancel. A batch is *quiet* once no byte of it can land any more: mori reported it
done, or it failed in a way that stops its queue pairs. Until then the mori status stays
referenced, because mori's completion thread writes it through a raw pointer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from moriio.adapters.mori.status import MoriStatusCode, classify_status
from moriio.ports import PeerId, TransferState, TransferStatus

PENDING_CODES = (int(MoriStatusCode.INIT), int(MoriStatusCode.IN_PROGRESS))

SETTLE_SECONDS = 2.0
"""After a failure that may leave work posted on other queue pairs (several QPs or chains),
how long until no byte can land: RC retries give up after about 0.5 s (timeout 14, retry 7)."""

PARTIAL_POST_NOTE = (
    "; the batch may have been partly posted (several post chains), so it is not re-posted: "
    "the posted part may still land"
)


@dataclass(slots=True, eq=False)
class Xfer:
    peer: PeerId
    lane: int
    local_id: int  # the local region posted from
    mem_id: int  # the mori memory that region lies in
    single_chain: bool
    status: Any | None = None  # the mori status while mori may still complete it
    final: TransferStatus | None = None  # the port state once decided
    posting: bool = True  # a mori call for it is running outside the adapter lock
    quiet_at: float | None = None  # from then on no byte of it can land; None: not known

    def finish(self, result: TransferStatus) -> None:
        if self.final is None:
            self.final = result

    def observe(self, now: float) -> tuple[int, TransferStatus] | None:
        """mori's code and verdict once its status left the pending codes (then it is dropped)."""
        status = self.status
        if status is None:
            return None
        code = int(status.Code())
        if code in PENDING_CODES:
            return None
        message = str(status.Message())
        result = classify_status(code, message)
        self.status = None  # done, or failed by a completion: mori dropped its pointer
        settled = result.state is TransferState.SUCCEEDED or self.single_chain
        self.quiet_at = now if settled else now + SETTLE_SECONDS
        if result.state is TransferState.BACKPRESSURE:  # only posting refuses; never re-post
            result = TransferStatus(TransferState.FAILED, result.message + PARTIAL_POST_NOTE)
        return code, result

    def is_quiet(self, now: float) -> bool:
        """Call after :meth:`observe`."""
        return (
            not self.posting
            and self.status is None
            and self.quiet_at is not None
            and self.quiet_at <= now
        )
