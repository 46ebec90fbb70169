"""Bookkeeping of one posted batch: its mori status, its port state, and when it is quiet.

mori has no cancel. A batch is *quiet* once no byte of it can land any more: mori reported it
done, it was refused before anything was posted, or it failed in a way that stops its queue
pairs. Work left posted on other queue pairs after a failure stops within the QPs' retry
budget (:meth:`~moriio.adapters.mori.settings.RdmaTuning.settle_deadline`), or when the engine
holding them is destroyed. Until mori can no longer write a status (its completion thread
stores the code, unlocks, and only then notifies the status's waiters), the status stays
referenced: see :class:`StatusKeeper`.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from moriio.adapters.mori.status import MoriStatusCode, classify_status
from moriio.domain.timing.policy import TransferPolicy
from moriio.ports import MemoryKind, PeerId, TransferOp, TransferState, TransferStatus

PENDING_CODES = (int(MoriStatusCode.INIT), int(MoriStatusCode.IN_PROGRESS))

PARTIAL_POST_NOTE = (
    "; the batch may have been partly posted (several post chains), so it is not re-posted: "
    "the posted part may still land"
)


@dataclass(frozen=True, slots=True)
class Batch:
    """What one post asks mori to move (kept until mori was given it)."""

    op: TransferOp
    local_offsets: np.ndarray[Any, np.dtype[np.int64]]
    remote_offsets: np.ndarray[Any, np.dtype[np.int64]]
    sizes: np.ndarray[Any, np.dtype[np.int64]]

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())


@dataclass(slots=True, eq=False)
class Xfer:
    peer: PeerId
    lane: int
    local_id: int  # the local region posted from
    mem_id: int  # the mori memory that region lies in
    kind: MemoryKind
    batch: Batch
    uid: int = -1  # the transfer uid mori posted it under (-1: not posted yet)
    status: Any | None = None  # the mori status while mori may still complete it
    final: TransferStatus | None = None  # the port state once decided
    posting: bool = False  # a mori call for it is running outside the adapter lock
    waiting: bool = False  # queued until its connection is built (nothing posted yet)
    quiet_at: float | None = None  # from then on no byte of it can land; None: not known

    def finish(self, result: TransferStatus) -> None:
        if self.final is None:
            self.final = result

    def observe(self) -> tuple[Any, int, str] | None:
        """(the status, mori's code, its message) once the status left the pending codes;
        the status is then handed over (this batch no longer holds it)."""
        status = self.status
        if status is None:
            return None
        code = int(status.Code())
        if code in PENDING_CODES:
            return None
        self.status = None
        return status, code, str(status.Message())

    def verdict(
        self, code: int, message: str, one_chain: bool, settle_at: float, now: float
    ) -> TransferStatus:
        """The port state of a status that left the pending codes, and when the batch is quiet:
        at once when it succeeded or ran as one chain (a failed chain's QP flushed the rest),
        else once work left posted on other queue pairs has stopped."""
        result = classify_status(code, message)
        settled = result.state is TransferState.SUCCEEDED or one_chain
        self.quiet_at = now if settled else settle_at
        if result.state is TransferState.BACKPRESSURE:  # only posting refuses; never re-post
            result = TransferStatus(TransferState.FAILED, result.message + PARTIAL_POST_NOTE)
        return result

    def is_quiet(self, now: float) -> bool:
        """Call after observing the status."""
        return (
            not self.posting
            and not self.waiting
            and self.status is None
            and self.quiet_at is not None
            and self.quiet_at <= now
        )


class StatusKeeper:
    """mori statuses no batch holds any more, kept until mori can no longer touch them: the
    completion thread's notify after a final code (:meth:`TransferPolicy.status_release_deadline`)
    and, after a failure, every later completion of work still posted (until the batch is
    quiet). Kept per lane: destroying a lane's engine ends mori's access to them all. A heap
    by release time, so that releasing the due ones costs nothing while none is due."""

    def __init__(self) -> None:
        self._kept: list[tuple[float, int, int, Any]] = []  # (release at, seq, lane, status)
        self._seq = 0

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, status: Any, lane: int, now: float, quiet_at: float | None) -> None:
        release = TransferPolicy.status_release_deadline(now)
        if quiet_at is None or math.isinf(quiet_at):
            release = math.inf
        else:
            release = max(release, TransferPolicy.status_release_deadline(quiet_at))
        self._seq += 1
        heapq.heappush(self._kept, (release, self._seq, lane, status))

    def release_due(self, now: float) -> None:
        kept = self._kept
        while kept and kept[0][0] <= now:
            heapq.heappop(kept)

    def release_lane(self, lane: int) -> None:
        self._kept = [k for k in self._kept if k[2] != lane]
        heapq.heapify(self._kept)

    def clear(self) -> None:
        self._kept.clear()
