"""Transfer ledgers: release bookkeeping for both transfer modes, in one import.

- :class:`WriteLedger` (producer, WRITE mode): one write per layer, sealed, finalized once.
- :class:`ReadLedger` (consumer, READ mode): per-layer read statuses and per-layer waits.
- :class:`ReleaseLedger` (producer, both modes; consumer in WRITE mode): transfer-id <->
  request-id mapping, ACK fan-in, buffered early ACKs, reported exactly once.

All take time as an argument, return failures as :class:`TransferResult` records, and keep
every call O(1) or O(items changed): expiry pops a deadline heap, never scans live state.
"""

from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.read_ledger import ReadLedger, ReadLedgerStats
from moriio.domain.ledgers.release_ledger import (
    DEFAULT_BUFFERED_ACK_TTL,
    DEFAULT_MAX_BUFFERED_ACKS,
    AckResult,
    ReleaseLedger,
    ReleaseStats,
    TrackResult,
)
from moriio.domain.ledgers.terminal_ids import DEFAULT_TERMINAL_CAPACITY, TerminalIds
from moriio.domain.ledgers.write_ledger import ScheduleResult, WriteLedger, WriteLedgerStats
from moriio.domain.timing.deadlines import DeadlineQueue

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
