"""Release bookkeeping: which transfers still hold blocks, resolved by ACKs, failures or expiry.

The producer maps each transfer id to its local request id and holds the request's blocks
until the transfer is released: by ``release`` ACKs from consumer ranks (fan-in for
heterogeneous TP), by its own write completion (WRITE mode, an ACK of size 1), by a failure,
or by expiry. The same ledger serves a WRITE-mode consumer waiting for ``write_done``.

Every tracked transfer is reported exactly once by :meth:`ReleaseLedger.pop_released`,
which is also when its id <-> request-id mapping is dropped. ACKs that arrive before the
mapping are buffered, bounded in count and age, with evictions counted. Not thread-safe:
drive it from one thread.

An ACK that names its consumer rank is counted once per (consumer TP size, rank): a
duplicate or replayed ACK never completes a fan-in early. A transfer tracked with a token
(its capability) counts only ACKs that carry the same token; others are refused.
"""

from __future__ import annotations

import enum
import hmac
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

from moriio.domain.kv.tp import expected_ack_count, release_acks
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.terminal_ids import DEFAULT_TERMINAL_CAPACITY, TerminalIds
from moriio.domain.timing.deadlines import DeadlineQueue

DEFAULT_MAX_BUFFERED_ACKS = 1024
DEFAULT_BUFFERED_ACK_TTL = 30.0


class AckResult(enum.Enum):
    """What the ledger did with one ACK or failure report."""

    COUNTED = "counted"  # live transfer, more ACKs expected
    RELEASED = "released"  # this event finished the transfer
    DUPLICATE = "duplicate"  # the transfer already finished: ignored
    BUFFERED = "buffered"  # transfer id not mapped yet: kept until track() or eviction
    REFUSED = "refused"  # the ACK lacks the transfer's token: ignored


class TrackResult(enum.Enum):
    """What :meth:`ReleaseLedger.track` did."""

    TRACKED = "tracked"  # live, waiting for its release
    RELEASED = "released"  # buffered ACKs released it at once
    TERMINAL = "terminal"  # the id finished recently: ignored, never released twice


@dataclass(frozen=True, slots=True)
class ReleaseStats:
    live: int  # tracked, not released yet
    awaiting_report: int  # released, not yet returned by pop_released
    buffered_events: int  # ACKs/failures held for unmapped ids
    buffered_transfer_ids: int
    buffered_evicted_overflow: int  # events dropped because the buffer was full
    buffered_evicted_stale: int  # events dropped because they aged out
    duplicates_ignored: int
    refused: int  # ACKs without the transfer's token
    succeeded: int
    failed: int
    expired: int
    terminal_evictions: int


class _Ack(NamedTuple):
    consumer_tp_size: int
    consumer_rank: int | None
    token: str


@dataclass(slots=True)
class _Buffered:
    first_seen: float
    acks: list[_Ack] = field(default_factory=list)
    failure: str | None = None

    @property
    def events(self) -> int:
        return len(self.acks) + (self.failure is not None)


class ReleaseLedger:
    """Transfer-id <-> request-id map with ACK fan-in, buffered early ACKs and deadlines."""

    def __init__(
        self,
        producer_tp: int = 1,
        *,
        max_buffered_acks: int = DEFAULT_MAX_BUFFERED_ACKS,
        buffered_ack_ttl: float = DEFAULT_BUFFERED_ACK_TTL,
        terminal_capacity: int = DEFAULT_TERMINAL_CAPACITY,
    ) -> None:
        expected_ack_count(producer_tp, producer_tp)  # validates producer_tp
        if isinstance(max_buffered_acks, bool) or not isinstance(max_buffered_acks, int):
            raise TypeError(f"max_buffered_acks must be an int, got {max_buffered_acks!r}")
        if max_buffered_acks < 0:
            raise ValueError(f"max_buffered_acks must be >= 0, got {max_buffered_acks}")
        if not math.isfinite(buffered_ack_ttl) or buffered_ack_ttl <= 0:
            raise ValueError(f"buffered_ack_ttl must be positive, got {buffered_ack_ttl!r}")
        self._producer_tp = producer_tp
        self._max_buffered = max_buffered_acks
        self._ttl = buffered_ack_ttl
        self._acks: dict[str, int] = {}  # live transfer id -> ACKs counted
        self._ranks: dict[str, set[tuple[int, int]]] = {}  # live id -> (size, rank) counted
        self._tokens: dict[str, str] = {}  # live id -> its capability token, if any
        self._request_of: dict[str, str] = {}  # live or unreported transfer id -> request id
        self._transfer_of: dict[str, str] = {}  # request id -> transfer id
        self._deadlines: DeadlineQueue[str] = DeadlineQueue()
        self._terminal = TerminalIds(terminal_capacity)
        self._unreported: list[TransferResult] = []
        self._buffer: OrderedDict[str, _Buffered] = OrderedDict()
        self._buffered_events = 0
        self._evicted_overflow = 0
        self._evicted_stale = 0
        self._duplicates = 0
        self._refused = 0
        self._counts = dict.fromkeys(Outcome, 0)

    # -- queries -------------------------------------------------------------------------

    @property
    def producer_tp(self) -> int:
        return self._producer_tp

    def is_live(self, transfer_id: str) -> bool:
        """Tracked and not released yet."""
        return transfer_id in self._acks

    def live_transfer_ids(self) -> tuple[str, ...]:
        return tuple(self._acks)

    def is_terminal(self, transfer_id: str) -> bool:
        """Released recently (bounded memory), whether reported or not."""
        return transfer_id in self._terminal

    def request_id(self, transfer_id: str) -> str | None:
        """The mapped request id (kept until the release is reported)."""
        return self._request_of.get(transfer_id)

    def transfer_id(self, request_id: str) -> str | None:
        return self._transfer_of.get(request_id)

    def holds(self, transfer_id: str, token: str) -> bool:
        """Whether ``transfer_id`` is live and ``token`` is the capability it was minted with."""
        wanted = self._tokens.get(transfer_id)
        return wanted is not None and hmac.compare_digest(token.encode(), wanted.encode())

    def ack_count(self, transfer_id: str) -> int:
        """ACKs counted so far for a live transfer (0 if not live)."""
        return self._acks.get(transfer_id, 0)

    def deadline(self, transfer_id: str) -> float | None:
        return self._deadlines.deadline(transfer_id)

    @property
    def stats(self) -> ReleaseStats:
        return ReleaseStats(
            live=len(self._acks),
            awaiting_report=len(self._unreported),
            buffered_events=self._buffered_events,
            buffered_transfer_ids=len(self._buffer),
            buffered_evicted_overflow=self._evicted_overflow,
            buffered_evicted_stale=self._evicted_stale,
            duplicates_ignored=self._duplicates,
            refused=self._refused,
            succeeded=self._counts[Outcome.SUCCEEDED],
            failed=self._counts[Outcome.FAILED],
            expired=self._counts[Outcome.EXPIRED],
            terminal_evictions=self._terminal.evictions,
        )

    # -- transitions ---------------------------------------------------------------------

    def track(
        self, transfer_id: str, request_id: str, deadline: float, now: float, token: str = ""
    ) -> TrackResult:
        """Map ``transfer_id`` to ``request_id`` and hold it until released or ``deadline``.

        ``token``: the transfer's capability; when given, only ACKs carrying it count.
        Buffered ACKs for the id are applied at once. Re-tracking a live id with the same
        request id is a no-op; a conflicting mapping raises ValueError.
        """
        self._evict_stale(now)
        if self._finished(transfer_id):
            stray = self._buffer_pop(transfer_id)
            self._duplicates += 0 if stray is None else stray.events
            return TrackResult.TERMINAL
        known = self._request_of.get(transfer_id)
        if known is not None:
            if known != request_id:
                raise ValueError(
                    f"transfer {transfer_id!r} is mapped to request {known!r}, not {request_id!r}"
                )
            return TrackResult.TRACKED
        other = self._transfer_of.get(request_id)
        if other is not None:
            raise ValueError(f"request {request_id!r} is already mapped to transfer {other!r}")
        self._acks[transfer_id] = 0
        self._ranks[transfer_id] = set()
        if token:
            self._tokens[transfer_id] = token
        self._request_of[transfer_id] = request_id
        self._transfer_of[request_id] = transfer_id
        self._deadlines.set(transfer_id, deadline)
        buffered = self._buffer_pop(transfer_id)
        if buffered is not None and self._apply_buffered(transfer_id, buffered):
            return TrackResult.RELEASED
        return TrackResult.TRACKED

    def set_deadline(self, transfer_id: str, deadline: float) -> bool:
        """Move a live transfer's deadline (e.g. when its request finishes locally)."""
        if transfer_id not in self._acks:
            return False
        self._deadlines.set(transfer_id, deadline)
        return True

    def ack(
        self,
        transfer_id: str,
        now: float,
        consumer_tp_size: int = 1,
        consumer_rank: int | None = None,
        token: str = "",
    ) -> AckResult:
        """Count one release ACK from consumer rank ``consumer_rank`` of TP ``consumer_tp_size``.

        The transfer is released once it has counted ``release_acks(producer_tp,
        consumer_tp_size)`` ACKs; a rank already counted is a duplicate (``None``: an
        unnamed local ACK, always counted). Raises ValueError if a size or the rank is out
        of range.
        """
        release_acks(self._producer_tp, consumer_tp_size)
        if consumer_rank is not None and not 0 <= consumer_rank < consumer_tp_size:
            raise ValueError(f"consumer rank {consumer_rank} not in [0, {consumer_tp_size})")
        self._evict_stale(now)
        if self._finished(transfer_id):
            self._duplicates += 1
            return AckResult.DUPLICATE
        ack = _Ack(consumer_tp_size, consumer_rank, token)
        if transfer_id not in self._acks:
            self._buffer_event(transfer_id, now, ack=ack)
            return AckResult.BUFFERED
        return self._apply(transfer_id, ack)

    def fail(self, transfer_id: str, message: str, now: float) -> AckResult:
        """Release a transfer as failed (write failed, consumer reported failure)."""
        self._evict_stale(now)
        if self._finished(transfer_id):
            self._duplicates += 1
            return AckResult.DUPLICATE
        if transfer_id not in self._acks:
            self._buffer_event(transfer_id, now, failure=message)
            return AckResult.BUFFERED
        self._release(transfer_id, Outcome.FAILED, message)
        return AckResult.RELEASED

    def expire(self, now: float) -> list[TransferResult]:
        """Release every live transfer whose deadline is ``<= now`` as expired.

        Returns the new expiries for logging or notifying peers; they are also queued for
        :meth:`pop_released`, the one place blocks should be freed from. Also drops buffered
        ACKs older than the buffer's TTL.
        """
        self._evict_stale(now)
        results = []
        for tid in self._deadlines.pop_due(now):
            message = f"no release before the deadline ({self._acks[tid]} ACKs counted)"
            results.append(self._release(tid, Outcome.EXPIRED, message))
        return results

    def pop_released(self) -> list[TransferResult]:
        """Every transfer released since the last call, once each; unmaps their ids."""
        released, self._unreported = self._unreported, []
        for result in released:
            request_id = self._request_of.pop(result.transfer_id)
            del self._transfer_of[request_id]
        return released

    # -- internals -----------------------------------------------------------------------

    def _finished(self, transfer_id: str) -> bool:
        """Released: remembered as terminal, or still awaiting its report."""
        return transfer_id in self._terminal or (
            transfer_id in self._request_of and transfer_id not in self._acks
        )

    def _apply(self, transfer_id: str, ack: _Ack) -> AckResult:
        """Check and count one ACK of a live transfer."""
        wanted = self._tokens.get(transfer_id)
        if wanted is not None and not hmac.compare_digest(ack.token.encode(), wanted.encode()):
            self._refused += 1
            return AckResult.REFUSED
        if ack.consumer_rank is not None:
            key = (ack.consumer_tp_size, ack.consumer_rank)
            ranks = self._ranks[transfer_id]
            if key in ranks:
                self._duplicates += 1
                return AckResult.DUPLICATE
            ranks.add(key)
        expected = release_acks(self._producer_tp, ack.consumer_tp_size)
        if self._count(transfer_id, expected):
            return AckResult.RELEASED
        return AckResult.COUNTED

    def _count(self, transfer_id: str, expected: int) -> bool:
        acks = self._acks[transfer_id] + 1
        self._acks[transfer_id] = acks
        if acks >= expected:
            self._release(transfer_id, Outcome.SUCCEEDED, f"{acks} ACKs")
            return True
        return False

    def _release(self, transfer_id: str, outcome: Outcome, message: str) -> TransferResult:
        del self._acks[transfer_id]
        del self._ranks[transfer_id]
        self._tokens.pop(transfer_id, None)
        self._deadlines.discard(transfer_id)
        self._terminal.add(transfer_id)
        self._counts[outcome] += 1
        result = TransferResult(
            transfer_id=transfer_id,
            outcome=outcome,
            message=message,
            request_id=self._request_of[transfer_id],
        )
        self._unreported.append(result)
        return result

    def _apply_buffered(self, transfer_id: str, buffered: _Buffered) -> bool:
        if buffered.failure is not None:
            self._duplicates += len(buffered.acks)
            self._release(transfer_id, Outcome.FAILED, buffered.failure)
            return True
        for i, ack in enumerate(buffered.acks):
            if self._apply(transfer_id, ack) is AckResult.RELEASED:
                self._duplicates += len(buffered.acks) - i - 1
                return True
        return False

    def _buffer_event(
        self, transfer_id: str, now: float, ack: _Ack | None = None, failure: str | None = None
    ) -> None:
        entry = self._buffer.get(transfer_id)
        if entry is None:
            entry = self._buffer[transfer_id] = _Buffered(first_seen=now)
        if failure is not None:
            if entry.failure is not None:
                self._duplicates += 1
                return
            entry.failure = failure
        else:
            assert ack is not None
            entry.acks.append(ack)
        self._buffered_events += 1
        while self._buffered_events > self._max_buffered:
            _, oldest = self._buffer.popitem(last=False)
            self._buffered_events -= oldest.events
            self._evicted_overflow += oldest.events

    def _buffer_pop(self, transfer_id: str) -> _Buffered | None:
        entry = self._buffer.pop(transfer_id, None)
        if entry is not None:
            self._buffered_events -= entry.events
        return entry

    def _evict_stale(self, now: float) -> None:
        buffer = self._buffer
        while buffer:
            oldest = next(iter(buffer.values()))
            if now - oldest.first_seen < self._ttl:
                return
            buffer.popitem(last=False)
            self._buffered_events -= oldest.events
            self._evicted_stale += oldest.events
