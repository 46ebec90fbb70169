"""What the per-layer ledgers share: live records by transfer id, deadlines, outcome counts."""

from __future__ import annotations

from typing import Generic, TypeVar

from moriio.domain.ledgers.outcome import Outcome
from moriio.domain.ledgers.terminal_ids import TerminalIds
from moriio.domain.timing.deadlines import DeadlineQueue

RecordT = TypeVar("RecordT")


class LayerLedger(Generic[RecordT]):
    """Live transfers' records, each under a deadline, finished exactly once.

    A finished transfer's id is remembered (bounded: :class:`TerminalIds`) and its outcome
    counted. Not thread-safe: drive it from one thread.
    """

    def __init__(self, terminal_capacity: int) -> None:
        self._live: dict[str, RecordT] = {}
        self._deadlines: DeadlineQueue[str] = DeadlineQueue()
        self._terminal = TerminalIds(terminal_capacity)
        self._succeeded = 0
        self._failed = 0
        self._expired = 0
        self._ignored_completions = 0

    def is_live(self, transfer_id: str) -> bool:
        return transfer_id in self._live

    def is_terminal(self, transfer_id: str) -> bool:
        """True for transfers finalized recently (bounded memory)."""
        return transfer_id in self._terminal

    def deadline(self, transfer_id: str) -> float | None:
        return self._deadlines.deadline(transfer_id)

    def set_deadline(self, transfer_id: str, deadline: float) -> bool:
        """Move a live transfer's deadline (e.g. once its destination is known)."""
        if transfer_id not in self._live:
            return False
        self._deadlines.set(transfer_id, deadline)
        return True

    def _close(self, transfer_id: str, outcome: Outcome) -> RecordT:
        """Remove a live transfer's record and deadline, remember its id, count ``outcome``."""
        record = self._live.pop(transfer_id)
        self._deadlines.discard(transfer_id)
        self._terminal.add(transfer_id)
        if outcome is Outcome.SUCCEEDED:
            self._succeeded += 1
        elif outcome is Outcome.FAILED:
            self._failed += 1
        else:
            self._expired += 1
        return record


def layer_failure(action: str, layer: str, message: str) -> str:
    """Why a transfer failed: ``action`` (``read``, ``write``) of ``layer`` and its error."""
    detail = f"{action} of layer {layer!r} failed"
    return f"{detail}: {message}" if message else detail
