"""The worker-side service: routes orders and messages to the producer and consumer halves.

One per worker process (per TP/DP rank). Every vLLM worker hook maps to one method here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from moriio.domain.params.orders import StepOrders
from moriio.domain.protocol.messages import (
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
    Release,
    RemoteBlocks,
    Retired,
    RetiredAck,
    WriteDone,
    WriteFailed,
)
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.consumer.load_report import LoadReport
from moriio.domain.worker.consumer.service import ConsumerService
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.poster import PostResult
from moriio.domain.worker.producer.read_holds import ReadHolder
from moriio.domain.worker.producer.service import ProducerService
from moriio.domain.worker.producer.write_fences import FencedLayer, FencedSaves, HostFences
from moriio.domain.worker.producer.write_pushes import WritePusher
from moriio.domain.worker.sleep import RetirementAcks, SleepCycle
from moriio.domain.worker.stats import WorkerStats, worker_stats
from moriio.log import get_logger
from moriio.ports import Inbound, TransferOp

log = get_logger("moriio.worker")

# The producer half for each mode, chosen once when the service is built.
PRODUCERS: dict[TransferMode, type[ProducerService]] = {
    TransferMode.READ: ReadHolder,
    TransferMode.WRITE: WritePusher,
}


@dataclass(slots=True)
class StepReport:
    finished_sending: set[str] = field(default_factory=set)
    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)

    def is_empty(self) -> bool:
        return self == StepReport()


class WorkerService:
    """Producer and/or consumer behaviour of one worker, driven by vLLM's hooks."""

    def __init__(
        self,
        ctx: WorkerContext,
        mode: TransferMode,
        *,
        is_producer: bool,
        is_consumer: bool,
        poll_interval: float = 100e-6,
    ) -> None:
        self.ctx = ctx
        self._poll_interval = poll_interval
        self.mode = mode
        self.producer = PRODUCERS[mode](ctx) if is_producer else None
        reads = mode is TransferMode.READ
        self.consumer = ConsumerService(ctx, verifies_releases=reads) if is_consumer else None
        producer = self.producer
        self._pusher = producer if isinstance(producer, WritePusher) else None
        self._fenced = FencedSaves()
        self.sleep = SleepCycle(ctx)  # this worker's registration through sleep and wake
        self._acks = RetirementAcks(ctx)  # peers' retired registrations to acknowledge

    def start_step(self, orders: StepOrders, wall_now: float) -> None:
        """Apply this step's orders (before the forward reads any KV)."""
        if self.producer is not None:
            # Drops first: the scheduler already freed expired hand-offs, so no completion
            # found by the pump below may report them in ``finished_sending`` again.
            self.producer.drop(orders.drops)
        self.pump()
        if self.producer is not None:
            self.producer.hold(orders.holds)
            self.producer.save(orders.saves)
        if self.consumer is not None:
            self.consumer.release(orders.releases)
            self.consumer.expect_writes(orders.expect_writes)
            self.consumer.abort_writes(orders.abort_writes)
            self.consumer.start_reads(orders.reads, wall_now)

    def retire(self) -> None:
        """Sleep mode: the KV memory is about to be released (see
        :mod:`moriio.domain.worker.sleep`); :meth:`SleepCycle.drained` says when it may be."""
        self.sleep.retire(self._give_up_all)

    def wake(self, local: LocalKV) -> None:
        """The KV memory is registered again as ``local``: transfers go on in the next
        registration generation."""
        self.sleep.wake(local)

    def _give_up_all(self, reason: str) -> None:
        if self.producer is not None:
            self.producer.give_up_all(reason)
        if self.consumer is not None:
            self.consumer.give_up_all(reason)

    def set_handoff_key(self, key: bytes) -> None:
        """The key this engine's scheduler signs READ hand-offs with: peers that handshake
        get it from now on (a READ producer refuses handshakes until it has one)."""
        self.ctx.peers.set_handoff_key(key)

    def wait_for_layer(self, layer: str) -> None:
        """Block until the layerwise reads of ``layer`` ended (bounded by their deadlines).

        Asynchronous reads are never awaited here: their requests are not in this forward.
        """
        consumer = self.consumer
        if consumer is None or self.mode is not TransferMode.READ:
            return
        while consumer.is_waiting_on(layer):
            self.pump(in_forward=True)
            if not consumer.is_waiting_on(layer):
                return
            self.ctx.clock.sleep(self._poll_interval)

    def wait_for_all_reads(self) -> None:
        """Block until every layerwise read posted so far ended (when per-layer hooks cannot
        run)."""
        consumer = self.consumer
        if consumer is None or self.mode is not TransferMode.READ:
            return
        while consumer.has_live_reads():
            self.pump(in_forward=True)
            if not consumer.has_live_reads():
                return
            self.ctx.clock.sleep(self._poll_interval)

    def save_layer(self, layer: str) -> None:
        """``layer``'s KV is being computed (forward thread), only while a write is live in
        this forward. Device memory only records a fence: the layer is posted by
        :meth:`pump` once the fence completed. Host memory posts at once, without a pump:
        the progress thread attaches destinations that arrive meanwhile, and the forward's
        end posts whatever no layer hook could."""
        pusher = self._pusher
        if pusher is None:
            return
        forward = pusher.forward
        if not pusher.writes_in(forward):
            return  # nothing to write: no fence, no post
        if not self._host_memory:
            fence = self.ctx.fences.record()
            if fence is not None:
                self._fenced.add_layer(forward, layer, fence)
                return
        pusher.save_layer(layer, forward)

    def end_forward(self) -> None:
        """The forward was launched (forward thread): its transfers are sealed once its work
        ran (device memory: behind a fence; host memory: now)."""
        pusher = self._pusher
        if pusher is None:
            return
        forward = pusher.forward
        pusher.forward += 1
        if not pusher.writes_in(forward):
            pusher.end_forward(forward)  # flags only: nothing of it can be posted
            return
        if not self._host_memory:
            fence = self.ctx.fences.record()
            if fence is not None:
                self._fenced.add_end(forward, fence)
                return
        self.pump()
        pusher.end_forward(forward)

    @property
    def _host_memory(self) -> bool:
        return isinstance(self.ctx.fences, HostFences)

    def finish_step(self) -> StepReport:
        """After the forward: progress everything, then say what finished."""
        self.pump()
        report = StepReport()
        if self.producer is not None:
            report.finished_sending |= self.producer.take_finished_sending()
        if self.consumer is not None:
            load: LoadReport = self.consumer.take_report()
            report.finished_recving |= load.finished_recving
            report.failed_recving |= load.failed_recving
            report.invalid_block_ids |= load.invalid_block_ids
        return report

    def pump(self, *, in_forward: bool = False) -> None:
        """Drive the transport, handle inbound messages, poll transfers, expire deadlines.

        ``in_forward``: the forward waits on this call, so no inline liveness probe (which
        blocks, with fakes) is sent from it.
        """
        ctx = self.ctx
        ctx.poster.progress_engine()
        self.dispatch(ctx.channel.drain())
        results = ctx.poster.progress()
        for peer in ctx.poster.take_torn_down():
            ctx.peers.torn_down(peer)
        probes = ctx.peers.probes.take()
        if self.consumer is not None:
            self.consumer.check_producers(may_block=not in_forward)  # before the results
            self.consumer.on_post_results(r for r in results if r.request.op is TransferOp.READ)
            self.consumer.progress()
        if self.producer is not None:
            self.producer.on_probes(probes)
            self.producer.on_post_results(r for r in results if r.request.op is TransferOp.WRITE)
            self._take_fenced()
            self.producer.progress()
        if self._acks:
            self._acks.send_due()

    def _take_fenced(self) -> None:
        """Post the layers, and end the forwards, whose device work has run."""
        pusher = self._pusher
        if pusher is None or not self._fenced:
            return
        for item in self._fenced.take_ready():
            if isinstance(item, FencedLayer):
                pusher.save_layer(item.layer, item.forward)
            else:
                pusher.end_forward(item.forward)

    def close(self) -> None:
        """Stop the background handshakes and liveness probes (the adapters close apart)."""
        if self.consumer is not None:
            self.consumer.probes.close()
        self.ctx.peers.close()

    def stats_snapshot(self) -> WorkerStats:
        """The counters now (no duration samples: those are for :meth:`take_stats`)."""
        return worker_stats(self.ctx, take_samples=False)

    def observe_batches(self, observer: Callable[[Sequence[PostResult]], None]) -> None:
        """Also hand every batch result (a layer of a transfer ending) to ``observer``."""
        self.ctx.poster.observe(observer)

    def take_stats(self) -> WorkerStats:
        """The counters now, plus the duration samples recorded since the previous call."""
        return worker_stats(self.ctx, take_samples=True)

    def dispatch(self, inbound: Iterable[Inbound[Message]]) -> None:
        """Hand control messages already taken from the channel to the services."""
        for item in inbound:
            self._dispatch(item.message)

    def has_news(self) -> bool:
        """Whether the next :meth:`finish_step` has something to report."""
        if self.producer is not None and self.producer.has_finished_sending():
            return True
        return self.consumer is not None and self.consumer.has_report()

    def needs_progress(self) -> bool:
        """Whether anything is live that advances only when pumped: polled work (below), or
        transfers that wait for a peer's message or a deadline."""
        return self.num_live > 0 or self.needs_polling()

    def needs_polling(self) -> bool:
        """Whether live work advances only when polled, not on a message or a deadline:
        batches on the transport (or quarantined), device fences, reads (posted, ending or
        waiting for a handshake's answer), gates to open, and a READ producer's hand-offs
        (the target of its consumers' reads: some transports, UCX over TCP among them, move
        a one-sided READ only while its target drives progress)."""
        consumer, producer = self.consumer, self.producer
        return (
            self.ctx.poster.num_inflight > 0
            or len(self._fenced) > 0
            or (consumer is not None and consumer.num_polled > 0)
            or (self.mode is TransferMode.READ and producer is not None and producer.num_live > 0)
        )

    @property
    def num_live(self) -> int:
        live = 0
        if self.producer is not None:
            live += self.producer.num_live
        if self.consumer is not None:
            live += self.consumer.num_live
        return live

    def _dispatch(self, message: Message) -> None:
        producer, consumer = self.producer, self.consumer
        match message:
            case RemoteBlocks() if producer is not None:
                producer.on_remote_blocks(message)
            case Release() if producer is not None:
                producer.on_release(message)
            case WriteDone() if consumer is not None:
                consumer.on_write_done(message)
            case WriteFailed() if consumer is not None:
                consumer.on_write_failed(message)
            case Retired():
                self._acks.on_retired(message)
            case RetiredAck():
                self.sleep.on_ack(message)
            case HandshakeRequest() | HandshakeReply() | HandshakeRejected() | _:
                self.ctx.counters.messages_ignored += 1
                log.warning("unexpected message ignored", message=type(message).__name__)
