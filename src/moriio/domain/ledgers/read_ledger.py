"""Consumer bookkeeping of READ-mode (pull) transfers: per-layer read statuses.

A transfer is terminal when every layer's read succeeded, as soon as one failed, or when its
deadline passes. An index from layer to waiting transfers lets a per-layer barrier wait on
one layer only. Not thread-safe: drive it from one thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from moriio.domain.ledgers.layer_ledger import LayerLedger, layer_failure
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.terminal_ids import DEFAULT_TERMINAL_CAPACITY


@dataclass(frozen=True, slots=True)
class ReadLedgerStats:
    live: int
    pending_layer_reads: int
    succeeded: int
    failed: int
    expired: int
    ignored_completions: int  # unknown, terminal, or not pending
    terminal_evictions: int


@dataclass(slots=True)
class _Read:
    request_id: str
    total_layers: int
    pending: dict[str, int]  # layers still being read -> their batches not ended yet


class ReadLedger(LayerLedger[_Read]):
    """Per-layer read statuses of a consumer in READ mode."""

    def __init__(self, terminal_capacity: int = DEFAULT_TERMINAL_CAPACITY) -> None:
        super().__init__(terminal_capacity)
        self._by_layer: dict[str, dict[str, None]] = {}
        self._pending_reads = 0

    # -- queries -------------------------------------------------------------------------

    def knows(self, transfer_id: str) -> bool:
        """True if the transfer is live or finished recently (then :meth:`start` refuses it)."""
        return transfer_id in self._live or transfer_id in self._terminal

    def request_id(self, transfer_id: str) -> str | None:
        read = self._live.get(transfer_id)
        return None if read is None else read.request_id

    def pending_layers(self, transfer_id: str) -> tuple[str, ...]:
        """Layers of a live transfer whose read has not completed yet."""
        read = self._live.get(transfer_id)
        return () if read is None else tuple(read.pending)

    def transfers_waiting_on(self, layer: str) -> tuple[str, ...]:
        """Live transfers whose read of ``layer`` is still outstanding."""
        waiting = self._by_layer.get(layer)
        return () if waiting is None else tuple(waiting)

    @property
    def stats(self) -> ReadLedgerStats:
        return ReadLedgerStats(
            live=len(self._live),
            pending_layer_reads=self._pending_reads,
            succeeded=self._succeeded,
            failed=self._failed,
            expired=self._expired,
            ignored_completions=self._ignored_completions,
            terminal_evictions=self._terminal.evictions,
        )

    # -- transitions ---------------------------------------------------------------------

    def start(
        self, transfer_id: str, request_id: str, layers: Iterable[str], deadline: float
    ) -> TransferResult | None:
        """Track reads of ``layers`` for ``transfer_id``: a layer listed ``n`` times is read
        in ``n`` batches (from ``n`` producer ranks), done once all of them succeeded.

        With no layers (nothing to read: free-only) the transfer succeeds at once and its
        record is returned. Raises ValueError if the id is live or finished recently: a
        transfer id names exactly one transfer.
        """
        if self.knows(transfer_id):
            raise ValueError(f"transfer {transfer_id!r} was already started")
        pending: dict[str, int] = {}
        for layer in layers:
            pending[layer] = pending.get(layer, 0) + 1
        read = _Read(request_id=request_id, total_layers=len(pending), pending=pending)
        self._live[transfer_id] = read
        self._deadlines.set(transfer_id, deadline)
        for layer in pending:
            self._by_layer.setdefault(layer, {})[transfer_id] = None
        self._pending_reads += len(pending)
        if not pending:
            return self._finish(transfer_id, Outcome.SUCCEEDED, "nothing to read")
        return None

    def complete(
        self, transfer_id: str, layer: str, succeeded: bool, message: str = ""
    ) -> TransferResult | None:
        """Record the end of ``layer``'s read; returns the record if the transfer finished."""
        read = self._live.get(transfer_id)
        if read is None or layer not in read.pending:
            self._ignored_completions += 1
            return None
        if succeeded and read.pending[layer] > 1:
            read.pending[layer] -= 1  # another producer rank's batch of it is still running
            return None
        self._drop_pending(transfer_id, layer, read)
        if not succeeded:
            return self._finish(transfer_id, Outcome.FAILED, layer_failure("read", layer, message))
        if not read.pending:
            return self._finish(transfer_id, Outcome.SUCCEEDED, "")
        return None

    def fail(self, transfer_id: str, message: str) -> TransferResult | None:
        """Finalize a live transfer as failed; None if it is not live."""
        if transfer_id not in self._live:
            return None
        return self._finish(transfer_id, Outcome.FAILED, message)

    def expire(self, now: float) -> list[TransferResult]:
        """Finalize every live transfer whose deadline is ``<= now`` as expired."""
        results = []
        for tid in self._deadlines.pop_due(now):
            read = self._live[tid]
            done = read.total_layers - len(read.pending)
            message = f"deadline passed with {done}/{read.total_layers} layer reads done"
            results.append(self._finish(tid, Outcome.EXPIRED, message))
        return results

    # -- internals -----------------------------------------------------------------------

    def _drop_pending(self, transfer_id: str, layer: str, read: _Read) -> None:
        del read.pending[layer]
        self._pending_reads -= 1
        waiting = self._by_layer[layer]
        del waiting[transfer_id]
        if not waiting:
            del self._by_layer[layer]

    def _finish(self, transfer_id: str, outcome: Outcome, message: str) -> TransferResult:
        read = self._close(transfer_id, outcome)
        unfinished = tuple(read.pending)
        for layer in unfinished:
            self._drop_pending(transfer_id, layer, read)
        return TransferResult(
            transfer_id=transfer_id,
            outcome=outcome,
            message=message,
            request_id=read.request_id,
            unfinished_layers=unfinished,
        )
