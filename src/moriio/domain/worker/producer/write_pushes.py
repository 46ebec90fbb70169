"""WRITE producer: pushes each layer's KV into the consumer's announced blocks.

Only blocks announced for the prompt the KV was computed for are written (an announcement
for another prompt is refused and binds nothing). A transfer's blocks are freed once every
scheduled write ended and the consumer was told the verdict (``write_done``/``write_failed``).
"""

from __future__ import annotations

from collections.abc import Iterable

from moriio.domain.kv.block_groups import announced_group_sizes, announced_pairs
from moriio.domain.ledgers.outcome import TransferResult
from moriio.domain.ledgers.terminal_ids import TerminalIds
from moriio.domain.ledgers.write_ledger import WriteLedger
from moriio.domain.params.orders import HoldOrder, SaveOrder
from moriio.domain.protocol.messages import Release, RemoteBlocks, WriteFailed
from moriio.domain.values.capability import same_token
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.handshake_waits import HandshakeWaits
from moriio.domain.worker.liveness import WRITE_PRODUCER_SILENCE
from moriio.domain.worker.peer_checks import ConnectedPeer, PeerUnavailableError
from moriio.domain.worker.poster import PostRequest, PostResult
from moriio.domain.worker.producer.service import ProducerService
from moriio.domain.worker.producer.write_push_state import (
    EarlyAnnouncements,
    Push,
    another_prompt,
    connect_failure,
    lease_refusal,
    record_end,
)
from moriio.domain.worker.producer.write_shares import PushShares
from moriio.log import get_logger
from moriio.ports import TransferOp

log = get_logger("moriio.producer")


class WritePusher(ProducerService):
    """Writes layer by layer as the forward computes them; frees once the verdict is sent."""

    consumer_silence = WRITE_PRODUCER_SILENCE

    def __init__(self, ctx: WorkerContext) -> None:
        super().__init__(ctx)
        self._writes = WriteLedger()
        self._saves: dict[str, Push] = {}
        self._early = EarlyAnnouncements()
        self._cancelled = TerminalIds()
        self._shares = PushShares()  # one push per consumer rank written; blocks held
        self._handshakes: HandshakeWaits[str] = HandshakeWaits()  # transfer ids by consumer
        self.forward = 0  # the forward running now (or next): new saves belong to it

    # -- orders from the scheduler -------------------------------------------------------

    def hold(self, orders: Iterable[HoldOrder]) -> None:
        for order in orders:
            if self._shares.hold(order.transfer_id, order.request_id):
                self._finished_sending.add(order.request_id)

    def _expire(self, transfer_id: str) -> None:
        for share in self._shares.ids(transfer_id):
            self._shares.unhold(share)
            self._fail_write(share, "the scheduler reclaimed the blocks")

    def _cancel(self, transfer_id: str) -> None:
        for share in self._shares.ids(transfer_id):
            self._cancelled.add(share)
            early = self._early.pop(share)
            if early is not None:
                self._refuse(early, "request cancelled")

    def save(self, orders: Iterable[SaveOrder]) -> None:
        ctx = self._ctx
        now = ctx.clock.now()
        shares = (
            (share, rank, whole.transfer_id in self._cancelled)
            for whole in orders
            for share, rank in self._shares.split(whole, ctx.tp_rank, ctx.tp_size)
        )
        for order, rank, cancelled in shares:
            tid = order.transfer_id
            if tid in self._saves or self._writes.is_terminal(tid):
                ctx.counters.messages_ignored += 1
                continue
            ctx.counters.transfers_started += 1
            save = Push(order, ctx.policy.defer_deadline(now), forward=self.forward)
            save.consumer_rank = rank
            self._saves[tid] = save
            early = self._early.pop(tid)
            if cancelled or tid in self._cancelled:
                # The verdict goes back to the announcement, with its capability.
                save.dest = early
                self._fail_write(tid, "the consumer released the transfer before it started")
                continue
            if early is not None:
                self._attach(save, early)

    # -- forward hooks -------------------------------------------------------------------

    def save_layer(self, layer: str, forward: int | None = None) -> None:
        """``layer``'s KV of ``forward`` (default: the current one) is computed: write it
        wherever the destination is known."""
        forward = self.forward if forward is None else forward
        for save in list(self._saves.values()):
            live = save.ending is None and not save.forward_done
            if save.forward == forward and save.plans is not None and live:
                self._post_layer(save, layer)

    def end_forward(self, forward: int | None = None) -> None:
        """After ``forward`` (default: the current one, which ends now): write the layers no
        hook covered, and seal its transfers."""
        if forward is None:
            forward, self.forward = self.forward, self.forward + 1
        for save in list(self._saves.values()):
            if save.forward != forward or save.forward_done:
                continue
            save.forward_done = True
            if save.plans is not None and save.ending is None:
                self._post_all_and_seal(save)

    def writes_in(self, forward: int) -> bool:
        """Whether a live transfer's KV is computed in ``forward`` (a save may post)."""
        return any(s.forward == forward and s.ending is None for s in self._saves.values())

    # -- inbound messages ----------------------------------------------------------------

    def on_remote_blocks(self, message: RemoteBlocks) -> None:
        ctx, tid = self._ctx, message.transfer_id
        bound = self._bound_token(tid)
        if bound is not None:
            # The transfer is bound to its first announcement: a replay of it changes
            # nothing, another capability is a forgery (or a stale consumer) and is refused.
            if same_token(message.token, bound):
                ctx.counters.messages_ignored += 1
            else:
                ctx.counters.announcements_refused += 1
                log.warning("remote_blocks refused: another capability is bound", transfer_id=tid)
            return
        save = self._saves.get(tid)
        if save is not None:
            self._attach(save, message)
            return
        if tid in self._cancelled or self._writes.is_terminal(tid):
            self._refuse(message, "transfer already ended")
            return
        refusal = self._lease_refusal(message)
        if refusal is not None:
            ctx.counters.late_announcements += 1
            self._cancelled.add(tid)  # its save, when it comes, ends at once
            self._refuse(message, refusal)
            return
        old = self._early.add(message, ctx.clock.now())
        if old is not None:
            ctx.counters.early_blocks_evicted += 1
            self._refuse(old, "producer overloaded")

    def on_release(self, message: Release) -> None:
        """The consumer gives the transfer up. Once an announcement bound the transfer, only
        a release with its capability counts (before that, one can only cancel it)."""
        tid = message.transfer_id
        bound = self._bound_token(tid)
        if bound is not None and not same_token(message.token, bound):
            self._ctx.counters.releases_refused += 1
            log.warning("release refused: it lacks the transfer's capability", transfer_id=tid)
            return
        if tid in self._saves:
            self._fail_write(tid, "the consumer released the transfer")
        else:
            self._cancelled.add(tid)

    # -- progress ------------------------------------------------------------------------

    def on_post_results(self, results: Iterable[PostResult]) -> None:
        for result in results:
            req = result.request
            if not result.ok:
                self._suspect_consumer(req.transfer_id)
            for layer in req.covered:
                ended = self._writes.complete(req.transfer_id, layer, result.ok, result.message)
                if ended is not None:
                    self._end_write(ended)
                    break

    def give_up_all(self, reason: str) -> None:
        """Fail every push (see the base class): each consumer gets its verdict once no
        batch of it is in flight."""
        for tid in list(self._saves):
            self._fail_write(tid, reason)

    def _holds(self, transfer_id: str, token: str) -> bool:
        return (bound := self._bound_token(transfer_id)) is not None and same_token(token, bound)

    def _consumer_lost(self, transfer_id: str) -> None:
        """Post nothing more (the consumer keeps its blocks until its lease or our verdict)."""
        if transfer_id in self._saves:
            self._fail_write(transfer_id, "the consumer stopped answering liveness probes")
        elif self._early.pop(transfer_id) is not None:
            self._cancelled.add(transfer_id)

    def progress(self) -> None:
        ctx = self._ctx
        self._resume_handshakes()
        now = ctx.clock.now()
        for ended in self._writes.expire(now):
            self._suspect_consumer(ended.transfer_id)
            self._end_write(ended)
        for save in list(self._saves.values()):
            if save.ending is not None:
                self._end_write(save.ending)
            elif save.dest is None and now >= save.deadline:
                self._fail_write(save.order.transfer_id, "remote_blocks never arrived")
        ctx.counters.messages_ignored += self._early.expire(now, ctx.policy.defer_timeout)

    @property
    def num_live(self) -> int:
        return len(self._saves)

    @property
    def pending_buffers(self) -> dict[str, int]:
        return {"early_remote_blocks": len(self._early)}

    def _refuse(self, dest: RemoteBlocks, reason: str) -> None:
        """Answer an announcement with ``write_failed`` (it carries the announcement's token)."""
        verdict = WriteFailed(dest.transfer_id, reason, dest.token)
        self._ctx.send(dest.reply_to, verdict, "write_failed")

    def _bound_token(self, transfer_id: str) -> str | None:
        """The capability of the announcement the transfer is bound to (None: none yet)."""
        save = self._saves.get(transfer_id)
        if save is not None and save.dest is not None:
            return save.dest.token
        early = self._early.get(transfer_id)
        return early.token if early is not None else None

    def _lease_refusal(self, dest: RemoteBlocks) -> str | None:
        return lease_refusal(dest, self._ctx.wall_now(), self._ctx.policy)

    def _writes_allowed(self, save: Push) -> bool:
        return save.dest is not None and self._lease_refusal(save.dest) is None

    def _fail_late(self, save: Push) -> None:
        self._ctx.counters.late_announcements += 1
        assert save.dest is not None
        self._fail_write(save.order.transfer_id, self._lease_refusal(save.dest) or "late")

    def _attach(self, save: Push, dest: RemoteBlocks) -> None:
        ctx = self._ctx
        refused = another_prompt(ctx, save.order.prompt, dest)
        if refused is not None:  # announced for another prompt: binds nothing
            self._refuse(dest, refused)
            return
        save.dest = dest
        tid = save.order.transfer_id
        self._claims.claim(tid, (dest.reply_to, dest.consumer_instance_id), ctx.clock.now())
        if not self._writes_allowed(save):
            self._fail_late(save)
            return
        try:
            save.pairs = announced_pairs(save.order.block_ids, dest.block_ids, dest.first_block)
            save.group_sizes = announced_group_sizes(len(save.order.block_ids), dest.block_ids)
        except ValueError as exc:
            self._fail_write(tid, str(exc))
            return
        peers = ctx.peers
        try:
            generation = dest.consumer_generation or None  # 0: not stated
            peer = peers.lookup(dest.reply_to, dest.consumer_instance_id, generation)
            if peer is None:
                # Off the worker's path: the push waits here, other transfers go on.
                peers.begin_handshake(dest.reply_to)
                deadline = peers.handshake_wait_deadline(ctx.clock.now())
                self._handshakes.park(tid, dest.reply_to, tid, deadline)
                self._resume_handshakes()  # an inline handshake has answered already
                return
        except PeerUnavailableError as exc:
            self._fail_connect(save, exc)
            return
        self._connected(save, peer)

    def _resume_handshakes(self) -> None:
        """Go on with the pushes whose handshake settled; fail the overdue ones."""
        if not self._handshakes:
            return
        peers = self._ctx.peers
        for address, outcome in peers.settle_handshakes().items():
            for tid in self._handshakes.take(address):
                save = self._saves.get(tid)
                if save is None or save.dest is None or save.ending is not None:
                    continue
                try:
                    dest = save.dest
                    generation = dest.consumer_generation or None  # 0: not stated
                    peer = peers.check_serves(
                        outcome, address, dest.consumer_instance_id, generation
                    )
                except PeerUnavailableError as exc:
                    self._fail_connect(save, exc)
                    continue
                self._connected(save, peer)
        for tid in self._handshakes.expire(self._ctx.clock.now()):
            if tid in self._saves:
                self._fail_write(tid, "no handshake with the consumer in time")

    def _fail_connect(self, save: Push, exc: PeerUnavailableError) -> None:
        self._fail_write(save.order.transfer_id, connect_failure(save, exc))

    def _connected(self, save: Push, peer: ConnectedPeer) -> None:
        """The consumer is handshaken: plan the push, and post it if the forward ran."""
        tid = save.order.transfer_id
        ctx = self._ctx
        problem = save.connect(peer, ctx.policy.transfer_deadline(ctx.clock.now()), ctx)
        if problem is not None:
            self._fail_write(tid, problem)
            return
        self._writes.set_deadline(tid, save.deadline)
        if save.forward_done:
            self._post_all_and_seal(save)

    def _post_layer(self, save: Push, layer_name: str) -> None:
        assert save.plans is not None
        assert save.peer is not None
        tid = save.order.transfer_id
        layer = self._ctx.kv.get(layer_name)
        if layer is None or layer_name in save.posted:
            return
        remote = save.peer.layers.get(layer_name)
        if remote is None:
            self._fail_write(tid, f"consumer has no KV layer {layer_name!r}")
            return
        if not self._writes_allowed(save):
            # The consumer may give its blocks back now: post nothing more, end the transfer.
            self._fail_late(save)
            return
        if not self._writes.schedule(tid, layer_name, save.deadline).accepted:
            return
        save.posted.add(layer_name)
        try:
            plan = save.plan(layer, remote)
        except ValueError as exc:
            self._writes.complete(tid, layer_name, False, str(exc))
            self._fail_write(tid, str(exc))
            return
        self._ctx.poster.submit(
            PostRequest(tid, layer_name, TransferOp.WRITE, layer.region, remote.region, plan)
        )

    def _post_all_and_seal(self, save: Push) -> None:
        tid, kv = save.order.transfer_id, self._ctx.kv
        left = [name for name in kv.names if name not in save.posted]
        # No layer hook posted these: they move as one request (a batch per span pair).
        for post in save.together(kv, left) if self._writes_allowed(save) else ():
            if all(self._writes.schedule(tid, x, save.deadline).accepted for x in post.covered):
                save.posted.update(post.covered)
                self._ctx.poster.submit(post)
        for name in left:
            if save.ending is not None:
                return
            self._post_layer(save, name)  # skips the layers posted together
        if save.ending is None:
            ended = self._writes.seal(tid)
            if ended is not None:
                self._end_write(ended)

    def _fail_write(self, transfer_id: str, reason: str) -> None:
        if (ended := self._writes.fail(transfer_id, reason)) is not None:
            self._end_write(ended)

    def _end_write(self, result: TransferResult) -> None:
        """A write transfer ended: once no batch reads our blocks, tell the consumer, free."""
        ctx, tid = self._ctx, result.transfer_id
        save = self._saves.get(tid)
        if save is None:
            return
        save.ending = result
        if ctx.poster.inflight(tid):
            if not save.quarantined and ctx.poster.quarantined(tid):
                # A write that timed out may still land: no verdict (which would let the
                # consumer reuse its blocks) before the engine says it settled.
                save.quarantined = True
                ctx.counters.quarantined_blocks += len(save.dest.block_ids) if save.dest else 0
            return
        del self._saves[tid]
        self._claims.drop(tid)
        self._cancelled.add(tid)
        record_end(ctx, save, result)
        verdict = save.verdict(result)
        target = save.verdict_target(self._ctx)
        if target is not None:
            ctx.send(target, verdict, type(verdict).__name__)
        request_id = save.order.request_id
        last = self._shares.ended(tid, request_id, request_id in self._suppressed)
        if last and not self._reclaimed(request_id):
            self._finished_sending.add(request_id)

    def _suspect_consumer(self, transfer_id: str) -> None:
        """A write failed or timed out: check the consumer's instance before the next use."""
        if (save := self._saves.get(transfer_id)) is not None and save.peer is not None:
            self._ctx.peers.forget(save.peer.address)
