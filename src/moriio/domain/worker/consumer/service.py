"""Decode-side worker service: pulls KV (READ, :mod:`~moriio.domain.worker.consumer.read_side`)
or awaits pushed KV (WRITE, :mod:`~moriio.domain.worker.consumer.write_loads`), then releases.

A failed, refused or timed-out load never raises: it marks the request's blocks as load
errors and still frees the producer's blocks. An asynchronous load (every WRITE, READ with
``load_mode`` async) is reported finished, failed or not, once it is terminal; a
layerwise READ is awaited by the forward. Handshakes never run on this path: a read to a
peer not handshaken yet waits for a background handshake. Driven from the worker's thread.
"""

from __future__ import annotations

from collections.abc import Iterable

from moriio.domain.kv.shards import ranks_covered
from moriio.domain.kv.tp import producer_ranks_to_release
from moriio.domain.params.orders import AbortWriteOrder, ExpectWriteOrder, ReadOrder, ReleaseOrder
from moriio.domain.protocol.messages import Release, WriteDone, WriteFailed
from moriio.domain.worker.consumer.gate_book import GateBook
from moriio.domain.worker.consumer.handoff_checks import may_release
from moriio.domain.worker.consumer.load_report import LoadReport
from moriio.domain.worker.consumer.read_loads import ReadInfo
from moriio.domain.worker.consumer.read_side import ReadSide
from moriio.domain.worker.consumer.write_loads import WriteLoads, notify_address
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.liveness import Lost, ProducerProbes
from moriio.domain.worker.poster import PostResult
from moriio.log import get_logger
from moriio.ports import PeerAddress

log = get_logger("moriio.consumer")


class ConsumerService:
    """READ: one batched read per layer per request. WRITE: announce blocks, await write_done.

    ``verifies_releases``: a release without a read frees a producer's blocks only for a
    hand-off that verifies for the request (READ, where the producer signs)."""

    def __init__(self, ctx: WorkerContext, *, verifies_releases: bool = False) -> None:
        self._ctx = ctx
        self._verifies_releases = verifies_releases
        self._writes = WriteLoads(ctx, self._load_ended)
        self._report = LoadReport()
        self.probes = ProducerProbes(
            ctx.channel,
            ctx.clock,
            instance_id=ctx.peers.instance_id,
            control=ctx.control,
            timeout=ctx.policy.liveness_timeout,
            background=ctx.peers.background,
        )
        self._writes.probes = self.probes
        self._reads = ReadSide(
            ctx, self.probes, self._fail_load, self._release, self._read_ok, self._release_verified
        )
        gates = ctx.layer_gates
        self.gates = None if gates is None else GateBook(gates, [x.name for x in ctx.kv])

    # -- READ ----------------------------------------------------------------------------

    def start_reads(self, orders: Iterable[ReadOrder], wall_now: float) -> None:
        """Post this step's reads (a batch per pair of spans; per layer when layer-wise); failures
        become load errors.

        ``wall_now``: wall-clock seconds now (producers' leases are wall-clock times); time
        spent in handshakes is added from the monotonic clock.
        """
        before = set(self._reads.sync)
        self._reads.start(orders, wall_now)
        if self.gates is not None:  # the forward's device stream waits on this step's reads
            self.gates.arm(frozenset(self._reads.sync - before))

    def is_waiting_on(self, layer: str, among: frozenset[str] | None = None) -> bool:
        """Whether a layerwise read of ``layer`` (one of ``among``, when given) is still
        running (ends by its deadlines).

        A read that already failed but still has batches in flight counts too, as does one
        waiting for its handshake: its load errors must be reported in this step, before
        the forward uses the blocks. Asynchronous reads never hold up a forward.
        """
        return self._reads.is_waiting_on(layer, among)

    def has_live_reads(self) -> bool:
        """Whether a layerwise read is not terminal yet."""
        return bool(self._reads.sync)

    def _read_ok(self, info: ReadInfo) -> None:
        if info.load_async:
            self._report.finished_recving.add(info.request_id)

    def _fail_load(self, request_id: str, blocks: tuple[int, ...], load_async: bool) -> None:
        """Withhold ``blocks`` from vLLM; an asynchronous load also stops waiting."""
        report = self._report
        report.invalid_block_ids.update(blocks)
        if load_async:
            report.finished_recving.add(request_id)
            report.failed_recving.add(request_id)

    def _release(
        self, transfer_id: str, targets: Iterable[PeerAddress], instance_id: str | None, token: str
    ) -> None:
        """Free the producer's blocks, unless the instance that holds them is known gone
        (the process now at its address never heard of the transfer)."""
        if self._ctx.peers.is_gone(instance_id):
            return
        ctx = self._ctx
        message = Release(transfer_id, ctx.tp_size, ctx.tp_rank, token)
        for target in targets:
            self._ctx.send(target, message, "release")

    # -- WRITE ---------------------------------------------------------------------------

    def expect_writes(self, orders: Iterable[ExpectWriteOrder]) -> None:
        self._writes.expect(orders)

    def abort_writes(self, orders: Iterable[AbortWriteOrder]) -> None:
        self._writes.abort(orders)

    def on_write_done(self, message: WriteDone) -> None:
        self._writes.on_write_done(message)

    def on_write_failed(self, message: WriteFailed) -> None:
        self._writes.on_write_failed(message)

    def _load_ended(
        self, request_id: str, blocks: tuple[int, ...], ok: bool, reason: str, kind: str
    ) -> None:
        self._report.finished_recving.add(request_id)
        if not ok:
            log.warning("load failed", request_id=request_id, kind=kind, reason=reason)
            self._ctx.counters.transfers_failed += 1
            self._ctx.counters.failed(kind)
            self._fail_load(request_id, blocks, True)

    # -- both ----------------------------------------------------------------------------

    def release(self, orders: Iterable[ReleaseOrder]) -> None:
        """Free producers' blocks without reading (aborts, full local prefix hits): only
        hand-offs that verify against their producer's key (one not handshaken yet is asked
        for it first, off this path)."""
        ctx = self._ctx
        for order in orders:
            verifies = self._verifies_releases
            if verifies and not may_release(ctx, order.peer, order.handoff, order.transfer_id):
                self._reads.release_once_verified(order)
                continue
            self._send_release(order)

    def _release_verified(self, order: ReleaseOrder) -> None:
        if may_release(self._ctx, order.peer, order.handoff, order.transfer_id):
            self._send_release(order)

    def _send_release(self, order: ReleaseOrder) -> None:
        ctx = self._ctx
        peer_tp = order.peer.tp_size or ctx.tp_size
        try:
            ranks: Iterable[int] = producer_ranks_to_release(ctx.tp_rank, ctx.tp_size, peer_tp)
        except ValueError:
            # TP sizes that do not pair: every producer rank is still told, once.
            ranks = ranks_covered(ctx.tp_rank, ctx.tp_size, peer_tp)
        self._release(
            order.transfer_id,
            (notify_address(order.peer, r, peer_tp, ctx.pp_rank, ctx.pp_size) for r in ranks),
            order.peer.instance_id,
            order.token,
        )

    def check_producers(self, *, may_block: bool = True) -> None:
        """Give up the transfers of producers that stopped answering or restarted. Called
        between polling the transport and applying its results: a read seen complete counts
        only if its producer answered within the liveness bound after that."""
        for lost in self.probes.tick(may_block=may_block):
            self._lose(lost)

    def _lose(self, lost: Lost) -> None:
        ctx = self._ctx
        peer = ctx.peers.connected(lost.producer)
        if peer is not None:
            ctx.poster.abandon(peer.engine, lost.reason)  # its batches end, quarantined
        ctx.peers.forget(lost.producer)  # handshake again before the next use
        for tid in lost.transfer_ids:
            if self._reads.owns(tid):
                self._reads.lose(tid, lost.reason)
            elif lost.dead:  # a silent producer may still write: the lease fences it
                self._writes.lose(tid, lost.reason)

    def give_up_all(self, reason: str) -> None:
        """This worker's KV memory is about to be released (sleep mode): fail every load;
        producers' blocks are released."""
        self._reads.give_up_all(reason)
        self._writes.give_up_all(reason)

    def on_post_results(self, results: Iterable[PostResult]) -> None:
        self._reads.on_post_results(results)

    def progress(self) -> None:
        """Expire deadlines and finish what ended (batches are polled by the caller)."""
        self._reads.progress()
        self._writes.expire(self._ctx.clock.now())
        if self.gates is not None:
            self.gates.open_ready(self.is_waiting_on)

    def has_report(self) -> bool:
        return self._report != LoadReport()

    def take_report(self) -> LoadReport:
        report, self._report = self._report, LoadReport()
        return report

    @property
    def num_live(self) -> int:
        return self.num_polled + self._writes.num_live

    @property
    def num_polled(self) -> int:
        """Live work that moves only when pumped: reads (posted, ending or waiting for a
        handshake) and gates to open. Awaited writes move on their producer's messages."""
        armed = self.gates is not None and self.gates.armed
        return self._reads.num_live + armed
