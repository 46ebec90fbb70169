"""Producer bookkeeping of WRITE-mode (push) transfers: one write per layer, sealed, finalized once.

The producer schedules one write per layer as each layer's KV is computed, seals the
transfer after the forward with the number of layers actually scheduled, and finalizes it
exactly once: success when every sealed write succeeded, failure as soon as one failed,
expiry when its deadline passes first. Not thread-safe: drive it from one thread.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from moriio.domain.ledgers.layer_ledger import LayerLedger, layer_failure
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.terminal_ids import DEFAULT_TERMINAL_CAPACITY


class ScheduleResult(enum.Enum):
    """What :meth:`WriteLedger.schedule` did with a (transfer, layer) pair."""

    SCHEDULED = "scheduled"  # new layer: post its write
    DUPLICATE = "duplicate"  # layer already scheduled for this transfer: ignored
    SEALED = "sealed"  # the transfer was sealed: no new layers, ignored
    TERMINAL = "terminal"  # the transfer already finished: ignored

    @property
    def accepted(self) -> bool:
        return self is ScheduleResult.SCHEDULED


@dataclass(frozen=True, slots=True)
class WriteLedgerStats:
    live: int
    sealed: int
    succeeded: int
    failed: int
    expired: int
    duplicate_schedules: int
    ignored_schedules: int  # for sealed or terminal transfers
    ignored_completions: int  # unknown, terminal, unscheduled or repeated layer
    terminal_evictions: int


@dataclass(slots=True)
class _Write:
    scheduled: dict[str, None] = field(default_factory=dict)  # insertion-ordered set
    pending: dict[str, None] = field(default_factory=dict)  # scheduled, not yet completed
    expected: int | None = None  # set by seal()


class WriteLedger(LayerLedger[_Write]):
    """Per-transfer write bookkeeping of a producer in WRITE mode."""

    def __init__(self, terminal_capacity: int = DEFAULT_TERMINAL_CAPACITY) -> None:
        super().__init__(terminal_capacity)
        self._sealed = 0
        self._duplicate_schedules = 0
        self._ignored_schedules = 0

    # -- queries -------------------------------------------------------------------------

    def is_sealed(self, transfer_id: str) -> bool:
        write = self._live.get(transfer_id)
        return write is not None and write.expected is not None

    def scheduled_layers(self, transfer_id: str) -> tuple[str, ...]:
        write = self._live.get(transfer_id)
        return () if write is None else tuple(write.scheduled)

    def pending_layers(self, transfer_id: str) -> tuple[str, ...]:
        """Scheduled layers whose write has not completed yet."""
        write = self._live.get(transfer_id)
        return () if write is None else tuple(write.pending)

    @property
    def stats(self) -> WriteLedgerStats:
        return WriteLedgerStats(
            live=len(self._live),
            sealed=self._sealed,
            succeeded=self._succeeded,
            failed=self._failed,
            expired=self._expired,
            duplicate_schedules=self._duplicate_schedules,
            ignored_schedules=self._ignored_schedules,
            ignored_completions=self._ignored_completions,
            terminal_evictions=self._terminal.evictions,
        )

    # -- transitions ---------------------------------------------------------------------

    def schedule(self, transfer_id: str, layer: str, deadline: float) -> ScheduleResult:
        """Record one write of ``layer``; ``deadline`` applies when the transfer is new."""
        if transfer_id in self._terminal:
            self._ignored_schedules += 1
            return ScheduleResult.TERMINAL
        write = self._live.get(transfer_id)
        if write is None:
            write = self._live[transfer_id] = _Write()
            self._deadlines.set(transfer_id, deadline)
        elif layer in write.scheduled:
            self._duplicate_schedules += 1
            return ScheduleResult.DUPLICATE
        elif write.expected is not None:
            self._ignored_schedules += 1
            return ScheduleResult.SEALED
        write.scheduled[layer] = None
        write.pending[layer] = None
        return ScheduleResult.SCHEDULED

    def seal(self, transfer_id: str) -> TransferResult | None:
        """Fix the expected write count to the layers scheduled so far.

        Returns the success record if every scheduled write already completed. Sealing an
        unknown, terminal or already sealed transfer does nothing.
        """
        write = self._live.get(transfer_id)
        if write is None or write.expected is not None:
            return None
        write.expected = len(write.scheduled)
        self._sealed += 1
        if not write.pending:
            return self._finish(transfer_id, Outcome.SUCCEEDED, "")
        return None

    def complete(
        self, transfer_id: str, layer: str, succeeded: bool, message: str = ""
    ) -> TransferResult | None:
        """Record the end of ``layer``'s write; returns the record if the transfer finished.

        A failed write finalizes the transfer as failed at once. Completions for unknown or
        terminal transfers, unscheduled layers and repeated completions are ignored.
        """
        write = self._live.get(transfer_id)
        if write is None or layer not in write.pending:
            self._ignored_completions += 1
            return None
        del write.pending[layer]
        if not succeeded:
            return self._finish(transfer_id, Outcome.FAILED, layer_failure("write", layer, message))
        if write.expected is not None and not write.pending:
            return self._finish(transfer_id, Outcome.SUCCEEDED, "")
        return None

    def fail(self, transfer_id: str, message: str) -> TransferResult | None:
        """Finalize a transfer as failed (peer gone, post refused, consumer released it).

        An id never seen is remembered as terminal too, so later schedules are refused.
        Returns None if the transfer had already finished.
        """
        if transfer_id in self._terminal:
            return None
        if transfer_id not in self._live:
            self._live[transfer_id] = _Write()
        return self._finish(transfer_id, Outcome.FAILED, message)

    def expire(self, now: float) -> list[TransferResult]:
        """Finalize every live transfer whose deadline is ``<= now`` as expired."""
        return [
            self._finish(tid, Outcome.EXPIRED, f"deadline passed with {self._describe(tid)}")
            for tid in self._deadlines.pop_due(now)
        ]

    # -- internals -----------------------------------------------------------------------

    def _describe(self, transfer_id: str) -> str:
        write = self._live[transfer_id]
        sealed = "unsealed" if write.expected is None else f"sealed at {write.expected}"
        done = len(write.scheduled) - len(write.pending)
        return f"{done}/{len(write.scheduled)} writes done ({sealed})"

    def _finish(self, transfer_id: str, outcome: Outcome, message: str) -> TransferResult:
        write = self._close(transfer_id, outcome)
        unfinished = () if outcome.ok else tuple(write.pending)
        return TransferResult(
            transfer_id=transfer_id,
            outcome=outcome,
            message=message,
            unfinished_layers=unfinished,
        )
