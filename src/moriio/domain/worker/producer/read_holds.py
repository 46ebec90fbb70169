"""READ producer: holds finished requests' blocks until every consumer rank released them."""

from __future__ import annotations

from collections.abc import Iterable

from moriio.domain.ledgers.release_ledger import AckResult, ReleaseLedger
from moriio.domain.params.orders import HoldOrder, SaveOrder
from moriio.domain.protocol.messages import Release
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.liveness import READ_PRODUCER_SILENCE
from moriio.domain.worker.poster import PostResult
from moriio.domain.worker.producer.service import ProducerService
from moriio.log import get_logger

log = get_logger("moriio.producer")


class ReadHolder(ProducerService):
    """Blocks are freed once every consumer rank released them, once a consumer reading them
    stopped answering, or at the worker deadline."""

    consumer_silence = READ_PRODUCER_SILENCE

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self._releases = ReleaseLedger(producer_tp=ctx.tp_size)
        self._given_up: set[str] = set()  # their consumer stopped answering: free, unreleased

    def hold(self, orders: Iterable[HoldOrder]) -> None:
        ctx = self._ctx
        now = ctx.clock.now()
        # The scheduler reclaims at its lease (``defer_timeout`` from the finish, plus the
        # skew allowance), but vLLM lets it check leases only in steps whose connector output
        # is not empty: an idle engine's first such step is the one where this deadline's
        # expiry is counted. It must stay later than the lease, and bounds memory too.
        deadline = ctx.policy.read_hold_deadline(now)
        for order in orders:
            self._releases.track(order.transfer_id, order.request_id, deadline, now, order.token)
            ctx.counters.transfers_started += 1  # a hand-off: its consumer reads, then releases

    def _expire(self, transfer_id: str) -> None:
        self._releases.fail(transfer_id, "lease expired", self._ctx.clock.now())

    def _cancel(self, transfer_id: str) -> None:
        """Nothing is held for a transfer that never started."""

    def save(self, orders: Iterable[SaveOrder]) -> None:
        """Consumers pull: a holder pushes nothing."""

    def save_layer(self, layer: str) -> None:
        """Consumers pull: a holder pushes nothing."""

    def end_forward(self) -> None:
        """Consumers pull: a holder pushes nothing."""

    def on_post_results(self, results: Iterable[PostResult]) -> None:
        """A holder posts no transfer."""

    def on_release(self, message: Release) -> None:
        ctx, tid = self._ctx, message.transfer_id
        try:
            result = self._releases.ack(
                tid,
                ctx.clock.now(),
                message.consumer_tp_size,
                message.consumer_tp_rank,
                message.token,
            )
        except ValueError as exc:
            ctx.counters.messages_ignored += 1
            log.warning("release ignored", transfer_id=tid, reason=str(exc))
            return
        if result is AckResult.REFUSED:
            ctx.counters.releases_refused += 1
            log.warning("release refused: it lacks the transfer's token", transfer_id=tid)

    def give_up_all(self, reason: str) -> None:
        """Free every hold: no consumer reads the blocks any more (see the base class)."""
        now = self._ctx.clock.now()
        for tid in self._releases.live_transfer_ids():
            self._given_up.add(tid)
            self._releases.fail(tid, reason, now)

    def _holds(self, transfer_id: str, token: str) -> bool:
        return self._releases.holds(transfer_id, token)

    def _consumer_lost(self, transfer_id: str) -> None:
        self._given_up.add(transfer_id)
        self._releases.fail(transfer_id, "the consumer stopped answering", self._ctx.clock.now())

    def progress(self) -> None:
        self._releases.expire(self._ctx.clock.now())
        counters = self._ctx.counters
        for result in self._releases.pop_released():
            rid = result.request_id
            self._claims.drop(result.transfer_id)
            given_up = result.transfer_id in self._given_up
            self._given_up.discard(result.transfer_id)
            if rid is None or self._reclaimed(rid):
                continue
            if given_up:  # no consumer can read the blocks any more
                self._finished_sending.add(rid)
            elif result.ok:
                counters.transfers_succeeded += 1
                self._finished_sending.add(rid)
            else:
                counters.transfers_expired += 1
                counters.failed("release_expired")
                log.error(
                    "no release before the worker deadline",
                    transfer_id=result.transfer_id,
                    request_id=rid,
                )

    @property
    def num_live(self) -> int:
        return self._releases.stats.live

    @property
    def pending_buffers(self) -> dict[str, int]:
        return {"buffered_releases": self._releases.stats.buffered_events}
