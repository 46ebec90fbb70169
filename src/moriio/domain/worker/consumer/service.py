"""Decode-side worker service: pulls KV (READ) or awaits pushed KV (WRITE), then releases.

A failed, refused or timed-out load never raises: it marks the request's blocks as load
errors and still frees the producer's blocks. An asynchronous load (every WRITE, READ with
``load_mode`` async) is reported finished, failed or not, once it is terminal; a
layerwise READ is awaited by the forward. Handshakes never run on this path: a read to a
peer not handshaken yet waits for a background handshake. Driven from the worker's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from moriio.domain.kv.tp import producer_ranks_to_release, remote_tp_rank
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.read_ledger import ReadLedger
from moriio.domain.params.orders import AbortWriteOrder, ExpectWriteOrder, ReadOrder, ReleaseOrder
from moriio.domain.params.transfer_params import port_offset
from moriio.domain.protocol.messages import Release, WriteDone, WriteFailed
from moriio.domain.worker.consumer.gate_book import GateBook
from moriio.domain.worker.consumer.load_report import LoadReport
from moriio.domain.worker.consumer.read_loads import ParkedRead, ReadInfo, lease_problem, plan_reads
from moriio.domain.worker.consumer.write_loads import WriteLoads
from moriio.domain.worker.consumer.write_loads import notify_address as _notify_address
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.handshake_waits import HandshakeWaits
from moriio.domain.worker.liveness import Lost, ProducerProbes
from moriio.domain.worker.peer_checks import (
    ConnectedPeer,
    PeerRestartedError,
    PeerUnavailableError,
)
from moriio.domain.worker.peers import Handshaken
from moriio.domain.worker.poster import PostResult
from moriio.log import get_logger
from moriio.ports import PeerAddress

log = get_logger("moriio.consumer")


class ConsumerService:
    """READ: one batched read per layer per request. WRITE: announce blocks, await write_done."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._reads = ReadLedger()
        self._read_info: dict[str, ReadInfo] = {}
        self._ending: dict[str, TransferResult] = {}  # ended, waiting for in-flight batches
        self._parked: HandshakeWaits[ParkedRead] = HandshakeWaits()
        self._sync: set[str] = set()  # layerwise reads not terminal: the forward awaits them
        self._writes = WriteLoads(ctx, self._load_ended)
        self._quarantined: set[str] = set()  # ended reads whose bytes may still land
        self._lost: set[str] = set()  # reads failed because their producer was lost
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
        gates = ctx.layer_gates
        self.gates = None if gates is None else GateBook(gates, [x.name for x in ctx.kv])

    # -- READ ----------------------------------------------------------------------------

    def start_reads(self, orders: Iterable[ReadOrder], wall_now: float) -> None:
        """Post this step's reads (one batch per layer); failures become load errors.

        ``wall_now``: wall-clock seconds now (producers' leases are wall-clock times); time
        spent in handshakes is added from the monotonic clock.
        """
        started, before = self._ctx.clock.now(), set(self._sync)
        for order in orders:
            self._start_read(order, wall_now + (self._ctx.clock.now() - started))
        self._resume_parked()  # inline handshakes have settled already
        if self.gates is not None:  # the forward's device stream waits on this step's reads
            self.gates.arm(frozenset(self._sync - before))

    def is_waiting_on(self, layer: str, among: frozenset[str] | None = None) -> bool:
        """Whether a layerwise read of ``layer`` (one of ``among``, when given) is still
        running (ends by its deadlines).

        A read that already failed but still has batches in flight counts too, as does one
        waiting for its handshake: its load errors must be reported in this step, before
        the forward uses the blocks. Asynchronous reads never hold up a forward.
        """
        sync = self._sync if among is None else self._sync & among
        if not sync:
            return False
        return any(t in sync for t in self._reads.transfers_waiting_on(layer)) or any(
            t in sync for t in (*self._ending, *self._parked.transfer_ids())
        )

    def has_live_reads(self) -> bool:
        """Whether a layerwise read is not terminal yet."""
        return bool(self._sync)

    def _start_read(self, order: ReadOrder, wall_now: float) -> None:
        ctx, tid = self._ctx, order.transfer_id
        if self._reads.knows(tid) or tid in self._ending or tid in self._parked:
            ctx.counters.messages_ignored += 1
            log.warning("read order for a known transfer ignored", transfer_id=tid)
            # The transfer is another request's: these blocks are never loaded.
            self._fail_load(order.request_id, order.local_block_ids, order.load_async)
            return
        if not order.load_async:
            self._sync.add(tid)
        peer_tp = order.peer.tp_size or ctx.tp_size
        try:
            source_rank = remote_tp_rank(ctx.tp_rank, ctx.tp_size, peer_tp)
            release_ranks = producer_ranks_to_release(ctx.tp_rank, ctx.tp_size, peer_tp)
        except ValueError as exc:
            self._refuse(order, "tp_mismatch", str(exc), ())
            return
        endpoint = order.peer
        pp = (ctx.pp_rank, ctx.pp_size)
        release_to = tuple(_notify_address(endpoint, r, peer_tp, *pp) for r in release_ranks)
        info = ReadInfo(
            order.request_id,
            order.local_block_ids,
            release_to,
            endpoint.instance_id,
            order.token,
            started=ctx.clock.now(),
            load_async=order.load_async,
        )
        ctx.counters.transfers_started += 1
        if self._lease_too_short(order, wall_now, release_to):
            return
        if not order.local_block_ids:
            self._read_info[tid] = info
            done = self._reads.start(tid, order.request_id, (), self._deadline())
            if done is not None:
                self._end_read(done)
            return
        handshake = PeerAddress(
            endpoint.host,
            endpoint.handshake_port
            + port_offset(endpoint.dp_rank, source_rank, peer_tp, ctx.pp_rank, ctx.pp_size),
        )
        parked = ParkedRead(order, info, handshake, wall_now, ctx.clock.now())
        try:
            peer = ctx.peers.lookup(handshake, endpoint.instance_id)
            if peer is None:
                ctx.peers.begin_handshake(handshake)
        except PeerUnavailableError as exc:
            self._refuse_peer(parked, exc)
            return
        if peer is not None:
            self._post(parked, peer)
            return
        deadline = ctx.peers.handshake_wait_deadline(parked.at)
        self._parked.park(tid, handshake, parked, deadline)

    def _resume_parked(self) -> None:
        """Resume (or refuse) the reads whose handshake settled; refuse the overdue ones."""
        peers = self._ctx.peers
        if not self._parked:
            return  # (a WRITE producer in the same worker settles its own handshakes)
        settled: dict[PeerAddress, Handshaken] = peers.settle_handshakes()
        for address, outcome in settled.items():
            for parked in self._parked.take(address):
                try:
                    peer = peers.check_serves(outcome, address, parked.order.peer.instance_id)
                except PeerUnavailableError as exc:
                    self._refuse_peer(parked, exc)
                    continue
                self._post(parked, peer)
        for parked in self._parked.expire(self._ctx.clock.now()):
            reason = f"no handshake with {parked.address} in time"
            self._refuse(parked.order, "handshake", reason, parked.info.release_to)

    def _refuse_peer(self, parked: ParkedRead, exc: PeerUnavailableError) -> None:
        order, release_to = parked.order, parked.info.release_to
        if isinstance(exc, PeerRestartedError):
            # The blocks died with the instance that minted the order, and the process now at
            # the address never heard of the transfer: no release for it. (Params that name no
            # instance may be the new process's own: those are still released.)
            reason = f"the producer restarted: its blocks are gone ({exc})"
            named = order.peer.instance_id is not None
            self._refuse(order, "restarted", reason, () if named else release_to)
        else:
            self._refuse(order, "handshake", str(exc), release_to)

    def _post(self, parked: ParkedRead, peer: ConnectedPeer) -> None:
        """Plan and submit a read whose producer is handshaken."""
        order, info, ctx = parked.order, parked.info, self._ctx
        try:
            posts = plan_reads(ctx.kv, order, peer)
        except ValueError as exc:
            self._refuse(order, "plan", str(exc), info.release_to)
            return
        # The handshake may have taken a while: the read must still end within the lease.
        wall_now = parked.wall + (ctx.clock.now() - parked.at)
        if self._lease_too_short(order, wall_now, info.release_to):
            return
        tid = order.transfer_id
        self._read_info[tid] = replace(info, source=parked.address)
        self.probes.watch(tid, parked.address, order.token, peer.instance_id)
        self._reads.start(tid, order.request_id, [p.layer for p in posts], self._deadline())
        for post in posts:
            ctx.poster.submit(post)

    def _lease_too_short(
        self, order: ReadOrder, wall_now: float, release_to: tuple[PeerAddress, ...]
    ) -> bool:
        """Refuse a read that could outlive the producer's lease on its blocks."""
        reason = lease_problem(order, wall_now, self._ctx.policy)
        if reason is None:
            return False
        self._ctx.counters.lease_refusals += 1
        self._refuse(order, "lease_expired", reason, release_to)
        return True

    def _refuse(
        self, order: ReadOrder, kind: str, reason: str, release_to: tuple[PeerAddress, ...]
    ) -> None:
        log.warning(
            "read refused",
            transfer_id=order.transfer_id,
            request_id=order.request_id,
            peer=f"{order.peer.host}:{order.peer.handshake_port}",
            reason=reason,
        )
        self._ctx.counters.transfers_failed += 1
        self._ctx.counters.failed(kind)
        self._sync.discard(order.transfer_id)
        self._fail_load(order.request_id, order.local_block_ids, order.load_async)
        self._release(order.transfer_id, release_to, order.peer.instance_id, order.token)

    def _fail_load(self, request_id: str, blocks: tuple[int, ...], load_async: bool) -> None:
        """Withhold ``blocks`` from vLLM; an asynchronous load also stops waiting."""
        report = self._report
        report.invalid_block_ids.update(blocks)
        if load_async:
            report.finished_recving.add(request_id)
            report.failed_recving.add(request_id)

    def _end_read(self, result: TransferResult) -> None:
        """A read transfer ended; finish it once none of its batches is in flight."""
        if self._ctx.poster.inflight(result.transfer_id):
            self._ending[result.transfer_id] = result
            return
        self._ending.pop(result.transfer_id, None)
        self.probes.unwatch(result.transfer_id)
        self._sync.discard(result.transfer_id)
        self._quarantined.discard(result.transfer_id)
        info = self._read_info.pop(result.transfer_id)
        counters = self._ctx.counters
        if result.ok:
            counters.transfers_succeeded += 1
            counters.load_seconds.append(self._ctx.clock.now() - info.started)
            if info.load_async:
                self._report.finished_recving.add(info.request_id)
        else:
            lost = result.transfer_id in self._lost
            kind = "expired" if result.outcome is Outcome.EXPIRED else "lost" if lost else "read"
            self._lost.discard(result.transfer_id)
            counters.transfers_expired += result.outcome is Outcome.EXPIRED
            counters.transfers_failed += 1
            counters.failed(kind)
            log.warning(
                "read failed",
                transfer_id=result.transfer_id,
                request_id=info.request_id,
                peer=str(info.source),
                reason=result.message,
            )
            self._fail_load(info.request_id, info.local_block_ids, info.load_async)
            if info.source is not None:
                self._ctx.peers.forget(info.source)  # it may have restarted: check next time
        self._release(result.transfer_id, info.release_to, info.instance_id, info.token)

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
        """Free producers' blocks without reading (aborts, full local prefix hits)."""
        ctx = self._ctx
        for order in orders:
            peer_tp = order.peer.tp_size or ctx.tp_size
            try:
                ranks = producer_ranks_to_release(ctx.tp_rank, ctx.tp_size, peer_tp)
            except ValueError as exc:
                log.warning("cannot release", transfer_id=order.transfer_id, reason=str(exc))
                ctx.counters.failed("tp_mismatch")
                continue
            self._release(
                order.transfer_id,
                (_notify_address(order.peer, r, peer_tp, ctx.pp_rank, ctx.pp_size) for r in ranks),
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
            if tid in self._read_info:
                self._lost.add(tid)
                if (ended := self._reads.fail(tid, lost.reason)) is not None:
                    self._end_read(ended)
            elif lost.dead:  # a silent producer may still write: the lease fences it
                self._writes.lose(tid, lost.reason)

    def on_post_results(self, results: Iterable[PostResult]) -> None:
        for result in results:
            request = result.request
            ended = self._reads.complete(
                request.transfer_id, request.layer, result.ok, result.message
            )
            if ended is not None:
                self._end_read(ended)

    def progress(self) -> None:
        """Expire deadlines and finish what ended (batches are polled by the caller)."""
        ctx = self._ctx
        self._resume_parked()
        now = ctx.clock.now()
        for ended in self._reads.expire(now):
            self._end_read(ended)
        for tid in list(self._ending):
            if not ctx.poster.inflight(tid):
                self._end_read(self._ending[tid])
            elif tid not in self._quarantined and ctx.poster.quarantined(tid):
                # A batch timed out or failed but may still land: the load error (and so
                # the blocks' reuse or recompute) waits until the engine says it settled.
                self._quarantined.add(tid)
                ctx.counters.quarantined_blocks += len(self._read_info[tid].local_block_ids)
        self._writes.expire(now)
        if self.gates is not None:
            self.gates.open_ready(self.is_waiting_on)

    def has_report(self) -> bool:
        return self._report != LoadReport()

    def take_report(self) -> LoadReport:
        report, self._report = self._report, LoadReport()
        return report

    def _deadline(self) -> float:
        return self._ctx.policy.transfer_deadline(self._ctx.clock.now())

    @property
    def num_live(self) -> int:
        live = self._reads.stats.live + len(self._ending) + len(self._parked)
        armed = self.gates is not None and self.gates.armed  # gates to open: keep pumping
        return live + self._writes.num_live + armed
