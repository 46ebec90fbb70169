"""Transfer ledgers: release bookkeeping for both transfer modes, in one import.

- :class:`WriteLedger` (producer, WRITE mode): one write per layer, sealed, finalized once.
- :class:`ReadLedger` (consumer, READ mode): per-layer read statuses and per-layer waits.
- :class:`ReleaseLedger` (producer, both modes; consumer in WRITE mode): transfer-id <->
  request-id mapping, ACK fan-in, buffered early ACKs, reported exactly once.

All take time as an argument, return failures as :class:`TransferResult` records, and keep
every call O(1) or O(items changed): expiry pops a deadline heap, never scans live state.
"""

from moriio.domain.deadlines import DeadlineQueue
from moriio.domain.outcome import Outcome, TransferResult
from moriio.domain.read_ledger import ReadLedger, ReadLedgerStats
from moriio.domain.release import (
    DEFAULT_BUFFERED_ACK_TTL,
    DEFAULT_MAX_BUFFERED_ACKS,
    AckResult,
    ReleaseLedger,
    ReleaseStats,
    TrackResult,
)
from moriio.domain.terminal_ids import DEFAULT_TERMINAL_CAPACITY, TerminalIds
from moriio.domain.write_ledger import ScheduleResult, WriteLedger, WriteLedgerStats

__all__ = [
    "DEFAULT_BUFFERED_ACK_TTL",
    "DEFAULT_MAX_BUFFERED_ACKS",
    "DEFAULT_TERMINAL_CAPACITY",
    "AckResult",
    "DeadlineQueue",
    "Outcome",
    "ReadLedger",
    "ReadLedgerStats",
    "ReleaseLedger",
    "ReleaseStats",
    "ScheduleResult",
    "TerminalIds",
    "TrackResult",
    "TransferResult",
    "WriteLedger",
    "WriteLedgerStats",
]
