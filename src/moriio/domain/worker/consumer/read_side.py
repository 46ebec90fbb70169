"""The decode worker's READ side: reads started, parked for a handshake, posted, ended.

One batched read per pair of spans per request (per layer for a layer-wise load). A read to
a peer not handshaken yet waits for a background handshake; its hand-off is then verified
against the producer's key and this request's prompt before anything is posted
(:mod:`.handoff_checks`). One refused or failed marks its blocks as load errors (through the
``fail_load`` the service hands in); the producer's blocks are freed (``release``) only for
a hand-off that verified: a request never frees another prompt's hand-off.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace

from moriio.domain.kv.shards import ranks_covered
from moriio.domain.kv.tp import producer_ranks_to_release
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.ledgers.read_ledger import ReadLedger
from moriio.domain.params.handoff_tags import HandoffRefusal
from moriio.domain.params.orders import ReadOrder, ReleaseOrder
from moriio.domain.worker.consumer.handoff_checks import (
    UNSIGNED,
    handoff_problem,
    may_release,
    release_source,
)
from moriio.domain.worker.consumer.read_loads import ParkedRead, ReadInfo, lease_problem, plan_reads
from moriio.domain.worker.consumer.read_sources import (
    plan_sliced_reads,
    source_addresses,
    source_ranks,
)
from moriio.domain.worker.consumer.write_loads import notify_address
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.handshake_waits import HandshakeWaits
from moriio.domain.worker.liveness import ProducerProbes
from moriio.domain.worker.peer_checks import (
    ConnectedPeer,
    PeerGenerationError,
    PeerRestartedError,
    PeerUnavailableError,
)
from moriio.domain.worker.peers import Handshaken
from moriio.domain.worker.poster import PostResult
from moriio.log import get_logger
from moriio.ports import PeerAddress

log = get_logger("moriio.consumer")

FailLoad = Callable[[str, tuple[int, ...], bool], None]  # request id, blocks, asynchronous
Release = Callable[[str, Iterable[PeerAddress], str | None, str], None]  # tid, to, instance, token


class ReadSide:
    """Every READ of one decode worker, from its order to its release."""

    def __init__(
        self,
        ctx: WorkerContext,
        probes: ProducerProbes,
        fail_load: FailLoad,
        release: Release,
        on_success: Callable[[ReadInfo], None],
        release_verified: Callable[[ReleaseOrder], None],
    ) -> None:
        """``release_verified``: frees a hand-off never read, once its producer, handshaken
        since it was parked (:meth:`release_once_verified`), can check it."""
        self._ctx = ctx
        self._probes = probes
        self._fail_load = fail_load
        self._release = release
        self._on_success = on_success
        self._reads = ReadLedger()
        self._read_info: dict[str, ReadInfo] = {}
        self._ending: dict[str, TransferResult] = {}  # ended, waiting for in-flight batches
        self._parked: HandshakeWaits[ParkedRead] = HandshakeWaits()
        self._releases: HandshakeWaits[ReleaseOrder] = HandshakeWaits()
        self._release_verified = release_verified
        self.sync: set[str] = set()  # layerwise reads not terminal: the forward awaits them
        self._quarantined: set[str] = set()  # ended reads whose bytes may still land
        self._lost: set[str] = set()  # reads failed because their producer was lost

    def start(self, orders: Iterable[ReadOrder], wall_now: float) -> None:
        """Post this step's reads; ``wall_now`` is advanced by the time spent on each."""
        started = self._ctx.clock.now()
        for order in orders:
            self._start_read(order, wall_now + (self._ctx.clock.now() - started))
        self.resume_parked()  # inline handshakes have settled already

    def is_waiting_on(self, layer: str, among: frozenset[str] | None = None) -> bool:
        """Whether a layerwise read of ``layer`` (one of ``among``, when given) is still
        running, ending, or waiting for its handshake."""
        sync = self.sync if among is None else self.sync & among
        if not sync:
            return False
        return any(t in sync for t in self._reads.transfers_waiting_on(layer)) or any(
            t in sync for t in (*self._ending, *self._parked.transfer_ids())
        )

    def owns(self, transfer_id: str) -> bool:
        return transfer_id in self._read_info

    def lose(self, transfer_id: str, reason: str) -> None:
        """Fail a read whose producer was lost."""
        self._lost.add(transfer_id)
        if (ended := self._reads.fail(transfer_id, reason)) is not None:
            self._end_read(ended)

    def give_up_all(self, reason: str) -> None:
        """Fail every read (the KV memory is about to be released): parked ones at once,
        posted ones once none of their batches is in flight."""
        for parked in self._parked.expire(math.inf):  # every wait is over
            self._refuse(parked.order, "asleep", reason, parked.info.release_to)
        for tid in list(self._read_info):
            if (ended := self._reads.fail(tid, reason)) is not None:
                self._end_read(ended)

    def on_post_results(self, results: Iterable[PostResult]) -> None:
        for result in results:
            request = result.request
            for layer in request.covered:
                ended = self._reads.complete(request.transfer_id, layer, result.ok, result.message)
                if ended is not None:
                    self._end_read(ended)
                    break

    def progress(self) -> None:
        """Resume parked reads, expire deadlines, finish reads whose batches settled."""
        ctx = self._ctx
        self.resume_parked()
        for ended in self._reads.expire(ctx.clock.now()):
            self._end_read(ended)
        for tid in list(self._ending):
            if not ctx.poster.inflight(tid):
                self._end_read(self._ending[tid])
            elif tid not in self._quarantined and ctx.poster.quarantined(tid):
                # A batch timed out or failed but may still land: the load error (and so
                # the blocks' reuse or recompute) waits until the engine says it settled.
                self._quarantined.add(tid)
                ctx.counters.quarantined_blocks += len(self._read_info[tid].local_block_ids)

    @property
    def num_live(self) -> int:
        return self._reads.stats.live + len(self._ending) + len(self._parked) + len(self._releases)

    def release_once_verified(self, order: ReleaseOrder) -> None:
        """A hand-off never read (an abort, a full local prefix hit) whose producer is not
        handshaken yet: ask it for its key (off this path), then free the hand-off if it
        verifies. A producer that does not answer in time reclaims its blocks at its lease."""
        ctx = self._ctx
        address = release_source(ctx, order.peer)
        if address is None or ctx.peers.connected(address) is not None:
            return  # no rank pairs with ours, or handshaken: the check has been made
        try:  # (not a producer known gone, nor one backed off after failing)
            if ctx.peers.lookup(address, order.peer.instance_id) is not None:
                return
            ctx.peers.begin_handshake(address)
        except PeerUnavailableError:
            return
        deadline = ctx.peers.handshake_wait_deadline(ctx.clock.now())
        self._releases.park(order.transfer_id, address, order, deadline)

    def resume_parked(self) -> None:
        """Resume (or refuse) the reads whose handshake settled; refuse the overdue ones."""
        peers = self._ctx.peers
        if not self._parked and not self._releases:
            return  # (a WRITE producer in the same worker settles its own handshakes)
        settled: dict[PeerAddress, Handshaken] = peers.settle_handshakes()
        for address, outcome in settled.items():
            for release in self._releases.take(address):
                if not isinstance(outcome, PeerUnavailableError):
                    self._release_verified(release)
            for parked in self._parked.take(address):
                try:
                    endpoint = parked.order.peer
                    peer = peers.check_serves(
                        outcome, address, endpoint.instance_id, endpoint.generation
                    )
                except PeerUnavailableError as exc:
                    self._refuse_peer(parked, exc)
                    continue
                self._connect(parked, {address: peer})
        self._releases.expire(self._ctx.clock.now())  # their producers reclaim at the lease
        for parked in self._parked.expire(self._ctx.clock.now()):
            reason = f"no handshake with {parked.address} in time"
            self._refuse(parked.order, "handshake", reason, parked.info.release_to)

    def _start_read(self, order: ReadOrder, wall_now: float) -> None:
        ctx, tid = self._ctx, order.transfer_id
        if order.handoff is None:
            self._refuse_handoff(order, *UNSIGNED)
            return
        if self._reads.knows(tid) or tid in self._ending or tid in self._parked:
            ctx.counters.messages_ignored += 1
            log.warning("read order for a known transfer ignored", transfer_id=tid)
            # The transfer is another request's: these blocks are never loaded.
            self._fail_load(order.request_id, order.local_block_ids, order.load_async)
            return
        if not order.load_async:
            self.sync.add(tid)
        peer_tp = order.peer.tp_size or ctx.tp_size
        try:
            ranks = source_ranks(ctx, peer_tp)
            release_ranks = producer_ranks_to_release(ctx.tp_rank, ctx.tp_size, peer_tp)
        except ValueError as exc:
            # Every producer rank is told once, for a hand-off that verifies (a producer not
            # handshaken yet reclaims its blocks at its lease).
            covered = ranks_covered(ctx.tp_rank, ctx.tp_size, peer_tp)
            pp = (ctx.pp_rank, ctx.pp_size)
            release = tuple(notify_address(order.peer, r, peer_tp, *pp) for r in covered)
            verified = may_release(ctx, order.peer, order.handoff, tid)
            self._refuse(order, "tp_mismatch", str(exc), release if verified else ())
            return
        endpoint = order.peer
        pp = (ctx.pp_rank, ctx.pp_size)
        release_to = tuple(notify_address(endpoint, r, peer_tp, *pp) for r in release_ranks)
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
        if not order.local_block_ids:
            self._read_info[tid] = info
            done = self._reads.start(
                tid, order.request_id, (), self._ctx.policy.transfer_deadline(self._ctx.clock.now())
            )
            if done is not None:
                self._end_read(done)
            return
        addresses = source_addresses(ctx, order, ranks)
        sliced = tuple(zip(ranks, addresses, strict=True)) if peer_tp != ctx.tp_size else ()
        self._connect(ParkedRead(order, info, addresses[0], wall_now, ctx.clock.now(), sliced), {})

    def _connect(self, parked: ParkedRead, known: dict[PeerAddress, ConnectedPeer]) -> None:
        """Post the read once every producer rank it reads from is handshaken; until then
        wait (off this path) for the handshakes, begun all at once."""
        ctx, order = self._ctx, parked.order
        sources = parked.sources or ((-1, parked.address),)
        peers: list[tuple[int, ConnectedPeer]] = []
        missing: list[PeerAddress] = []
        for rank, address in sources:
            peer = known.get(address)
            try:
                if peer is None:
                    peer = ctx.peers.lookup(address, order.peer.instance_id, order.peer.generation)
            except PeerUnavailableError as exc:
                self._refuse_peer(parked, exc)
                return
            if peer is None:
                missing.append(address)
            else:
                peers.append((rank, peer))
        if missing:
            wall_now = parked.wall + (ctx.clock.now() - parked.at)
            if self._lease_too_short(order, wall_now, ()):  # unverified: nothing is released
                return
            try:
                for address in missing:
                    ctx.peers.begin_handshake(address)
            except PeerUnavailableError as exc:
                self._refuse_peer(parked, exc)
                return
            deadline = ctx.peers.handshake_wait_deadline(parked.at)
            self._parked.park(order.transfer_id, missing[0], parked, deadline)
            return
        self._post(parked, peers)

    def _refuse_peer(self, parked: ParkedRead, exc: PeerUnavailableError) -> None:
        """No handshake: the hand-off cannot be verified, so nothing is released for it (a
        restarted producer's blocks died with it; a live one reclaims them at its lease)."""
        order = parked.order
        if isinstance(exc, PeerRestartedError):
            reason = f"the producer restarted: its blocks are gone ({exc})"
            self._refuse(order, "restarted", reason, ())
        elif isinstance(exc, PeerGenerationError):
            # The prefill slept since: its hand-off is still this request's to free, once it
            # verifies against the key the prefill's instance answers with.
            verified = may_release(self._ctx, order.peer, order.handoff, order.transfer_id)
            release_to = parked.info.release_to if verified else ()
            self._refuse(order, "retired_generation", str(exc), release_to)
        else:
            self._refuse(order, "handshake", str(exc), ())

    def _refuse_handoff(self, order: ReadOrder, kind: HandoffRefusal, reason: str) -> None:
        """Not this request's hand-off: nothing is read, nothing released (the producer's
        blocks may still be another request's to read)."""
        self._ctx.counters.handoffs_refused += 1
        self._refuse(order, kind.value, reason, ())

    def _post(self, parked: ParkedRead, peers: list[tuple[int, ConnectedPeer]]) -> None:
        """Plan and submit a read whose producer ranks are handshaken."""
        order, info, ctx = parked.order, parked.info, self._ctx
        # Every producer rank of an engine answers with its engine's key and instance.
        problem = next(filter(None, (handoff_problem(order.handoff, p) for _, p in peers)), None)
        if problem is not None:
            self._refuse_handoff(order, *problem)
            return
        info = replace(info, verified=True)
        try:
            if parked.sources:
                posts = [
                    post
                    for rank, peer in peers
                    for post in plan_sliced_reads(ctx, order, peer, rank)
                ]
            else:
                posts = plan_reads(ctx.kv, order, peers[0][1])
        except ValueError as exc:
            self._refuse(order, "plan", str(exc), info.release_to)
            return
        # The handshake may have taken a while: the read must still end within the lease.
        wall_now = parked.wall + (ctx.clock.now() - parked.at)
        if self._lease_too_short(order, wall_now, info.release_to):
            return
        tid = order.transfer_id
        addresses = tuple(peer.address for _, peer in peers)
        self._read_info[tid] = replace(info, source=addresses[0], sources=addresses)
        for _, peer in peers:
            self._probes.watch(tid, peer.address, order.token, peer.instance_id)
        self._reads.start(
            tid,
            order.request_id,
            [layer for p in posts for layer in p.covered],
            self._ctx.policy.transfer_deadline(self._ctx.clock.now()),
        )
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
        self.sync.discard(order.transfer_id)
        self._fail_load(order.request_id, order.local_block_ids, order.load_async)
        self._release(order.transfer_id, release_to, order.peer.instance_id, order.token)

    def _end_read(self, result: TransferResult) -> None:
        """A read transfer ended; finish it once none of its batches is in flight."""
        if self._ctx.poster.inflight(result.transfer_id):
            self._ending[result.transfer_id] = result
            return
        self._ending.pop(result.transfer_id, None)
        self._probes.unwatch(result.transfer_id)
        self.sync.discard(result.transfer_id)
        self._quarantined.discard(result.transfer_id)
        info = self._read_info.pop(result.transfer_id)
        counters = self._ctx.counters
        if result.ok:
            counters.transfers_succeeded += 1
            counters.load_seconds.append(self._ctx.clock.now() - info.started)
            self._on_success(info)
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
            for source in info.sources or (() if info.source is None else (info.source,)):
                self._ctx.peers.forget(source)  # it may have restarted: check next time
        self._release(result.transfer_id, info.release_to, info.instance_id, info.token)
