"""Prefill-side worker service: what a READ holder and a WRITE pusher share.

Blocks are reported free (``finished_sending``) only once no transfer can touch them. Which
half runs is chosen once, where the worker service is built; driven from the worker's thread.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from moriio.domain.params.orders import DropOrder, DropReason, HoldOrder, SaveOrder
from moriio.domain.protocol.messages import Probe, Release, RemoteBlocks
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.liveness import ConsumerClaims
from moriio.domain.worker.poster import PostResult
from moriio.log import get_logger

log = get_logger("moriio.producer")


class ProducerService(ABC):
    """One per worker with the producer role."""

    # A consumer that has not probed for this many liveness timeouts is given up (see
    # :mod:`moriio.domain.worker.liveness` for why each mode has its own).
    consumer_silence: float = 1.0

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._claims = ConsumerClaims(ctx.policy.liveness_silence(self.consumer_silence))
        self._suppressed: set[str] = set()  # request ids the scheduler already reclaimed
        self._finished_sending: set[str] = set()

    # -- orders from the scheduler -------------------------------------------------------

    @abstractmethod
    def hold(self, orders: Iterable[HoldOrder]) -> None:
        """Requests finished: their blocks stay allocated until their transfer ends."""

    def drop(self, orders: Iterable[DropOrder]) -> None:
        """Hand-offs the scheduler reclaimed (expired) or that will never start (cancelled)."""
        for order in orders:
            if order.reason is DropReason.EXPIRED:
                self._suppressed.add(order.request_id)
                self._expire(order.transfer_id)
                log.warning(
                    "hand-off expired", transfer_id=order.transfer_id, request_id=order.request_id
                )
            else:
                self._cancel(order.transfer_id)

    @abstractmethod
    def save(self, orders: Iterable[SaveOrder]) -> None:
        """WRITE: transfers whose KV this step's forward computes."""

    @abstractmethod
    def _expire(self, transfer_id: str) -> None:
        """The scheduler freed the transfer's blocks at its lease: end it, report nothing."""

    @abstractmethod
    def _cancel(self, transfer_id: str) -> None:
        """The transfer will never start: refuse anything that arrives for it."""

    # -- forward hooks -------------------------------------------------------------------

    @abstractmethod
    def save_layer(self, layer: str) -> None:
        """``layer``'s KV is computed."""

    @abstractmethod
    def end_forward(self) -> None:
        """The forward ended."""

    # -- inbound messages ----------------------------------------------------------------

    def on_remote_blocks(self, message: RemoteBlocks) -> None:
        """A consumer announced destination blocks (only a pusher writes into them)."""
        self._ctx.counters.messages_ignored += 1
        log.warning(
            "remote_blocks ignored: this engine does not push", transfer_id=message.transfer_id
        )

    @abstractmethod
    def on_release(self, message: Release) -> None:
        """A consumer is done with (or gives up) the transfer."""

    @abstractmethod
    def give_up_all(self, reason: str) -> None:
        """This worker's KV memory is about to be released (sleep mode): end every transfer
        as failed; the blocks are reported free once no batch of ours touches them."""

    def on_probes(self, probes: Iterable[tuple[Probe, float]]) -> None:
        """Consumers' liveness probes (with their arrival times): who holds which transfer;
        then give up the transfers of consumers gone silent (before anything is posted in
        this pump: a WRITE producer must stop first, see the liveness module)."""
        self._claims.record(probes, self._holds)
        for transfer_id in self._claims.silent(self._ctx.clock.now()):
            self._ctx.counters.failed("consumer_lost")
            log.warning("consumer stopped answering: transfer given up", transfer_id=transfer_id)
            self._consumer_lost(transfer_id)

    @abstractmethod
    def _holds(self, transfer_id: str, token: str) -> bool:
        """Whether ``transfer_id`` is live here and ``token`` is its capability."""

    @abstractmethod
    def _consumer_lost(self, transfer_id: str) -> None:
        """The consumer holding ``transfer_id`` stopped probing: give the transfer up."""

    # -- progress ------------------------------------------------------------------------

    @abstractmethod
    def on_post_results(self, results: Iterable[PostResult]) -> None:
        """Posted batches that ended."""

    @abstractmethod
    def progress(self) -> None:
        """Expire deadlines, report what ended."""

    def has_finished_sending(self) -> bool:
        return bool(self._finished_sending)

    def take_finished_sending(self) -> set[str]:
        finished, self._finished_sending = self._finished_sending, set()
        return finished

    @property
    @abstractmethod
    def num_live(self) -> int:
        """Transfers not ended yet."""

    @property
    @abstractmethod
    def pending_buffers(self) -> dict[str, int]:
        """Entries held for transfers not known yet (each buffer is bounded)."""

    def _reclaimed(self, request_id: str) -> bool:
        """Whether the scheduler already freed ``request_id``'s blocks (then report nothing)."""
        if request_id in self._suppressed:
            self._suppressed.discard(request_id)
            return True
        return False
