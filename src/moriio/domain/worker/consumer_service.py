"""Decode-side worker service: pulls KV (READ) or awaits pushed KV (WRITE), then releases.

A failed, refused or timed-out load never raises: it marks the request's blocks as load
errors and still frees the producer's blocks. Driven from the worker's thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.tp import producer_ranks_to_release, remote_tp_rank
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.read_ledger import ReadLedger
from moriio.domain.ledgers.terminal_ids import TerminalIds
from moriio.domain.timing.deadlines import DeadlineQueue
from moriio.domain.timing.policy import MAX_LEASE_SECONDS
from moriio.domain.wire.messages import Release, RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.wire.orders import (
    AbortWriteOrder,
    ExpectWriteOrder,
    ReadOrder,
    ReleaseOrder,
)
from moriio.domain.wire.transfer_params import PeerEndpoint, port_offset
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.peers import ConnectedPeer, PeerRestartedError, PeerUnavailableError
from moriio.domain.worker.poster import PostRequest, PostResult
from moriio.log import get_logger
from moriio.ports import PeerAddress, TransferOp

log = get_logger("moriio.consumer")


@dataclass(slots=True)
class LoadReport:
    """What the decode worker tells vLLM after a step."""

    finished_recving: set[str] = field(default_factory=set)
    failed_recving: set[str] = field(default_factory=set)
    invalid_block_ids: set[int] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Read:
    request_id: str
    local_block_ids: tuple[int, ...]
    release_to: tuple[PeerAddress, ...]
    instance_id: str | None  # the producer instance whose blocks are read
    token: str  # the producer's capability for the transfer, echoed in releases
    source: PeerAddress | None = None  # the producer rank read from (None: nothing to read)
    started: float = 0.0  # clock time the read order arrived


@dataclass(slots=True)
class _Expected:
    request_id: str
    local_block_ids: tuple[int, ...]
    producer: PeerAddress
    deadline: float
    started: float  # clock time the write expectation was announced
    released: bool = False  # a release was sent: the producer's verdict is all we wait for


class ConsumerService:
    """READ: one batched read per layer per request. WRITE: announce blocks, await write_done."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._reads = ReadLedger()
        self._read_info: dict[str, _Read] = {}
        self._ending: dict[str, TransferResult] = {}  # ended, waiting for in-flight batches
        self._expected: dict[str, _Expected] = {}
        self._write_deadlines: DeadlineQueue[str] = DeadlineQueue()
        self._fence_expired = TerminalIds()  # given back at the fence, without a verdict
        self._report = LoadReport()

    # -- READ ----------------------------------------------------------------------------

    def start_reads(self, orders: Iterable[ReadOrder], wall_now: float) -> None:
        """Post this step's reads (one batch per layer); failures become load errors.

        ``wall_now``: wall-clock seconds now (producers' leases are wall-clock times); time
        spent in handshakes is added from the monotonic clock.
        """
        started = self._ctx.clock.now()
        for order in orders:
            self._start_read(order, wall_now + (self._ctx.clock.now() - started))

    def is_waiting_on(self, layer: str) -> bool:
        """Whether a read of ``layer`` is still running (ends by its transfer deadline).

        A read that already failed but still has batches in flight counts too: its load
        errors must be reported in this step, before the forward uses the blocks.
        """
        return bool(self._reads.transfers_waiting_on(layer) or self._ending)

    def has_live_reads(self) -> bool:
        return bool(self._reads.stats.live or self._ending)

    def _start_read(self, order: ReadOrder, wall_now: float) -> None:
        ctx, tid = self._ctx, order.transfer_id
        if self._reads.knows(tid) or tid in self._ending:
            ctx.counters.messages_ignored += 1
            log.warning("read order for a known transfer ignored", transfer_id=tid)
            return
        peer_tp = order.peer.tp_size or ctx.tp_size
        try:
            source_rank = remote_tp_rank(ctx.tp_rank, ctx.tp_size, peer_tp)
            release_ranks = producer_ranks_to_release(ctx.tp_rank, ctx.tp_size, peer_tp)
        except ValueError as exc:
            self._refuse(order, "tp_mismatch", str(exc), ())
            return
        endpoint = order.peer
        release_to = tuple(_notify_address(endpoint, r, peer_tp) for r in release_ranks)
        info = _Read(
            order.request_id,
            order.local_block_ids,
            release_to,
            endpoint.instance_id,
            order.token,
            started=ctx.clock.now(),
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
            endpoint.handshake_port + port_offset(endpoint.dp_rank, source_rank, peer_tp),
        )
        checked_at = ctx.clock.now()
        try:
            peer = ctx.peers.connect(handshake, endpoint.instance_id)
            posts = self._plan(order, peer)
        except PeerRestartedError as exc:
            # The blocks died with the instance that minted the order, and the process now at
            # the address never heard of the transfer: no release for it. (Params that name no
            # instance may be the new process's own: those are still released.)
            reason = f"the producer restarted: its blocks are gone ({exc})"
            named = endpoint.instance_id is not None
            self._refuse(order, "restarted", reason, () if named else release_to)
            return
        except (PeerUnavailableError, ValueError) as exc:
            self._refuse(
                order,
                "handshake" if isinstance(exc, PeerUnavailableError) else "plan",
                str(exc),
                release_to,
            )
            return
        # The handshake may have taken a while: the read must still end within the lease.
        if self._lease_too_short(order, wall_now + (ctx.clock.now() - checked_at), release_to):
            return
        self._read_info[tid] = replace(info, source=handshake)
        self._reads.start(tid, order.request_id, [p.layer for p in posts], self._deadline())
        for post in posts:
            ctx.poster.submit(post)

    def _lease_too_short(
        self, order: ReadOrder, wall_now: float, release_to: tuple[PeerAddress, ...]
    ) -> bool:
        """Refuse a read that could outlive the producer's lease on its blocks.

        The lease is on the producer's clock: it is shortened here by the skew allowance. A
        lease further ahead than any configuration makes is refused as absurd.
        """
        expires = order.lease_expires_at
        if expires is None:
            return False
        policy = self._ctx.policy
        skew = policy.clock_skew_allowance
        if expires > wall_now + skew + MAX_LEASE_SECONDS:
            reason = f"the producer's lease {expires!r} is too far in the future"
        elif wall_now + policy.transfer_timeout + skew > expires:
            reason = "the producer's lease ends too soon"
        else:
            return False
        self._ctx.counters.lease_refusals += 1
        self._refuse(order, "lease_expired", reason, release_to)
        return True

    def _plan(self, order: ReadOrder, peer: ConnectedPeer) -> list[PostRequest]:
        caches: dict[int, PlanCache] = {}
        posts = []
        for layer in self._ctx.kv:
            remote = peer.layers.get(layer.name)
            if remote is None:
                raise ValueError(f"peer {peer.address} has no KV layer {layer.name!r}")
            cache = caches.get(remote.num_blocks)
            if cache is None:
                cache = caches[remote.num_blocks] = PlanCache(
                    order.local_block_ids, order.remote_block_ids, remote.num_blocks
                )
            plan = cache.plan_for(layer.geometry)
            posts.append(
                PostRequest(
                    order.transfer_id,
                    layer.name,
                    TransferOp.READ,
                    layer.region,
                    remote.region,
                    plan,
                )
            )
        return posts

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
        self._report.invalid_block_ids.update(order.local_block_ids)
        self._release(order.transfer_id, release_to, order.peer.instance_id, order.token)

    def _end_read(self, result: TransferResult) -> None:
        """A read transfer ended; finish it once none of its batches is in flight."""
        if self._ctx.poster.inflight(result.transfer_id):
            self._ending[result.transfer_id] = result
            return
        self._ending.pop(result.transfer_id, None)
        info = self._read_info.pop(result.transfer_id)
        counters = self._ctx.counters
        if result.ok:
            counters.transfers_succeeded += 1
            counters.load_seconds.append(self._ctx.clock.now() - info.started)
        else:
            kind = "expired" if result.outcome is Outcome.EXPIRED else "read"
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
            self._report.invalid_block_ids.update(info.local_block_ids)
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
        """Tell each producer rank where to write, and by when; wait for its verdict.

        The blocks are fenced by the write-by lease: the producer posts no write after it,
        and each post ends within one transfer timeout, so without a verdict the blocks are
        given back only after ``write_by + transfer_timeout + clock_skew_allowance``.
        """
        ctx = self._ctx
        policy = ctx.policy
        for order in orders:
            tid = order.transfer_id
            if tid in self._expected:
                ctx.counters.messages_ignored += 1
                continue
            peer_tp = order.peer.tp_size or ctx.tp_size
            ctx.counters.transfers_started += 1
            if peer_tp != ctx.tp_size:
                self._write_ended(
                    order.request_id,
                    order.local_block_ids,
                    False,
                    f"WRITE mode needs equal TP sizes (ours {ctx.tp_size}, producer {peer_tp})",
                    "tp_mismatch",
                )
                continue
            producer = _notify_address(order.peer, ctx.tp_rank, peer_tp)
            announce = RemoteBlocks(
                transfer_id=tid,
                request_id=order.request_id,
                block_ids=order.local_block_ids,
                first_block=order.first_block,
                consumer_dp_rank=ctx.dp_rank,
                consumer_tp_rank=ctx.tp_rank,
                consumer_tp_size=ctx.tp_size,
                reply_to=ctx.control,
                consumer_instance_id=ctx.peers.instance_id,
                write_by=ctx.wall_now() + policy.defer_timeout,
            )
            # Measured before the send: the fence may only end later than the lease says.
            deadline = (
                ctx.clock.now()
                + policy.defer_timeout
                + policy.transfer_timeout
                + policy.clock_skew_allowance
            )
            if not ctx.send(producer, announce, "remote_blocks"):
                self._write_ended(
                    order.request_id,
                    order.local_block_ids,
                    False,
                    f"could not reach producer {producer}",
                    "unreachable",
                )
                continue
            self._expected[tid] = _Expected(
                order.request_id, order.local_block_ids, producer, deadline, ctx.clock.now()
            )
            self._write_deadlines.set(tid, deadline)

    def abort_writes(self, orders: Iterable[AbortWriteOrder]) -> None:
        """The requests ended early: ask producers to stop; keep the blocks until they confirm.

        The deadline is not shortened: until it passes, a producer that missed the release
        (or got the announcement late) may still write into the blocks before the write-by
        lease, so they must not be reused before the verdict or the deadline.
        """
        ctx = self._ctx
        for order in orders:
            expected = self._expected.get(order.transfer_id)
            if expected is None or expected.released:
                continue
            expected.released = True
            ctx.send(expected.producer, Release(order.transfer_id, 1), "release (abort)")

    def _late_verdict(self, transfer_id: str) -> None:
        """A verdict for a transfer we no longer expect: count it, and say if it is late."""
        counters = self._ctx.counters
        counters.messages_ignored += 1
        if transfer_id in self._fence_expired:
            counters.late_completions += 1
            log.warning("verdict arrived after the blocks were given back", transfer_id=transfer_id)

    def on_write_done(self, message: WriteDone) -> None:
        expected = self._expected.pop(message.transfer_id, None)
        if expected is None:
            self._late_verdict(message.transfer_id)
            return
        self._write_deadlines.discard(message.transfer_id)
        self._ctx.counters.transfers_succeeded += 1
        self._ctx.counters.load_seconds.append(self._ctx.clock.now() - expected.started)
        self._write_ended(expected.request_id, expected.local_block_ids, True, "", "")

    def on_write_failed(self, message: WriteFailed) -> None:
        expected = self._expected.pop(message.transfer_id, None)
        if expected is None:
            self._late_verdict(message.transfer_id)
            return
        self._write_deadlines.discard(message.transfer_id)
        self._write_ended(
            expected.request_id,
            expected.local_block_ids,
            False,
            f"producer reported: {message.reason}",
            "write",
        )

    def _write_ended(
        self, request_id: str, blocks: tuple[int, ...], ok: bool, reason: str, kind: str
    ) -> None:
        report = self._report
        report.finished_recving.add(request_id)
        if not ok:
            log.warning("load failed", request_id=request_id, kind=kind, reason=reason)
            self._ctx.counters.transfers_failed += 1
            self._ctx.counters.failed(kind)
            report.failed_recving.add(request_id)
            report.invalid_block_ids.update(blocks)

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
                (_notify_address(order.peer, r, peer_tp) for r in ranks),
                order.peer.instance_id,
                order.token,
            )

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
        now = ctx.clock.now()
        for ended in self._reads.expire(now):
            self._end_read(ended)
        for tid in list(self._ending):
            if not ctx.poster.inflight(tid):
                self._end_read(self._ending[tid])
        for tid in self._write_deadlines.pop_due(now):
            # The write-by lease, every write's in-flight time and the skew allowance have
            # passed: no write of this transfer can still land. Free the producer's blocks.
            expected = self._expected.pop(tid)
            if not expected.released:
                ctx.send(expected.producer, Release(tid, 1), "release (expired)")
            self._fence_expired.add(tid)
            ctx.counters.quarantined_blocks += len(expected.local_block_ids)
            ctx.counters.transfers_expired += 1
            self._write_ended(
                expected.request_id,
                expected.local_block_ids,
                False,
                "no write_done before the deadline",
                "expired",
            )

    def take_report(self) -> LoadReport:
        report, self._report = self._report, LoadReport()
        return report

    def _deadline(self) -> float:
        return self._ctx.policy.transfer_deadline(self._ctx.clock.now())

    @property
    def num_live(self) -> int:
        return self._reads.stats.live + len(self._ending) + len(self._expected)


def _notify_address(endpoint: PeerEndpoint, tp_rank: int, tp_size: int) -> PeerAddress:
    return PeerAddress(
        endpoint.host, endpoint.notify_port + port_offset(endpoint.dp_rank, tp_rank, tp_size)
    )
