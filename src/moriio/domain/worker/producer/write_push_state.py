"""A WRITE push in progress, and the write-by lease that bounds it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.planner import TransferPlan
from moriio.domain.kv.shards import consumer_group
from moriio.domain.kv.slice_plans import RankPair, SlicedPlans
from moriio.domain.ledgers.outcome import Outcome, TransferResult
from moriio.domain.params.handoff_tags import HandoffRefusal, PromptBinding, scheme_refusal
from moriio.domain.params.orders import SaveOrder
from moriio.domain.params.transfer_params import port_offset
from moriio.domain.protocol.messages import RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.kv_registry import LocalKV, RegisteredLayer
from moriio.domain.worker.peer_checks import (
    ConnectedPeer,
    PeerRestartedError,
    PeerUnavailableError,
    RemoteLayer,
)
from moriio.domain.worker.poster import PostRequest
from moriio.domain.worker.request_posts import request_posts
from moriio.log import get_logger
from moriio.ports import PeerAddress, TransferOp

log = get_logger("moriio.producer")


@dataclass(slots=True)
class Push:
    """One WRITE transfer being pushed: its order, the consumer's blocks, its progress."""

    order: SaveOrder
    deadline: float
    dest: RemoteBlocks | None = None
    peer: ConnectedPeer | None = None
    plans: PlanCache | SlicedPlans | None = None
    pairs: tuple[tuple[int, ...], tuple[int, ...]] = ((), ())  # (producer, consumer) blocks
    forward: int = 0  # the forward (numbered by the pusher) that computes its KV
    forward_done: bool = False  # that forward has finished
    tell_consumer: bool = True  # False: the consumer instance is gone, no verdict to send
    ending: TransferResult | None = None
    posted: set[str] = field(default_factory=set)
    quarantined: bool = False  # a batch's bytes may still land: the verdict waits for it
    consumer_rank: int | None = None  # the consumer rank written (None: of our own index)
    group_sizes: tuple[int, ...] = ()  # pairs per KV-cache group (empty: one group)

    def connect(self, peer: ConnectedPeer, deadline: float, ctx: WorkerContext) -> str | None:
        """The consumer is handshaken: plan the push against its layers, due by
        ``deadline``; returns why it cannot be planned (None: planned)."""
        num_blocks = {layer.num_blocks for layer in peer.layers.values()}
        if len(num_blocks) != 1:
            return f"consumer layers disagree on num_blocks: {sorted(num_blocks)}"
        self.peer = peer
        source, dest = self.pairs
        consumer_tp = peer.fingerprint.tp_size
        if consumer_tp == ctx.tp_size:
            self.plans = PlanCache(source, dest, num_blocks.pop())
        else:
            rank = self.dest.consumer_tp_rank if self.dest is not None else -1
            if rank not in consumer_group(ctx.tp_rank, ctx.tp_size, consumer_tp):
                return f"consumer rank {rank} of TP {consumer_tp} takes no KV of this rank"
            ranks = RankPair(ctx.tp_rank, ctx.tp_size, rank, consumer_tp, local_consumes=False)
            self.plans = SlicedPlans(source, dest, self.group_sizes, num_blocks.pop(), ranks)
        self.deadline = deadline
        return None

    def together(self, kv: LocalKV, names: list[str]) -> list[PostRequest]:
        """The posts of layers ``names`` as one request (a batch per pair of spans); none
        when there is nothing to merge or it cannot be planned (the per-layer posts then
        name why)."""
        if self.peer is None or len(names) < 2 or not kv.spans:
            return []
        if isinstance(self.plans, SlicedPlans):
            return []  # a share of each page between TP sizes: planned layer by layer
        tid = self.order.transfer_id
        try:
            return request_posts(tid, TransferOp.WRITE, kv, self.peer, *self.pairs, names=names)
        except ValueError:
            return []

    def plan(self, layer: RegisteredLayer, remote: RemoteLayer) -> TransferPlan:
        """The plan of ``layer`` into the consumer's ``remote`` (after :meth:`connect`)."""
        if isinstance(self.plans, SlicedPlans):
            stride = remote.block_stride or layer.geometry.block_stride_bytes
            return self.plans.plan_for(
                layer.name, layer.geometry, layer.slicing, remote.slicing, remote.block_len, stride
            )
        assert self.plans is not None
        return self.plans.plan_for(layer.geometry, remote.block_stride)

    def verdict(self, result: TransferResult) -> WriteDone | WriteFailed:
        """What the consumer is told once the push ended, with its announcement's token."""
        tid, token = result.transfer_id, self.dest.token if self.dest is not None else ""
        if result.ok:
            return WriteDone(tid, token)
        return WriteFailed(tid, result.message or "write failed", token)

    def verdict_target(self, ctx: WorkerContext) -> PeerAddress | None:
        """Where the verdict goes: the announcement's reply address, else the consumer
        worker of this rank named in the order (None: nobody to tell)."""
        if not self.tell_consumer:
            return None
        if self.dest is not None:
            return self.dest.reply_to
        peer = self.order.peer
        if peer is None:
            return None
        tp = peer.tp_size or ctx.tp_size
        rank = ctx.tp_rank if self.consumer_rank is None else self.consumer_rank
        offset = port_offset(peer.dp_rank, rank, tp, ctx.pp_rank, ctx.pp_size)
        return PeerAddress(peer.host, peer.notify_port + offset)


MAX_EARLY_BLOCKS = 4096  # announcements buffered before their transfer's save


class EarlyAnnouncements:
    """Announcements (``remote_blocks``) that arrived before their transfer's save."""

    def __init__(self, limit: int = MAX_EARLY_BLOCKS) -> None:
        self._limit = limit
        self._items: OrderedDict[str, tuple[RemoteBlocks, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, transfer_id: str) -> RemoteBlocks | None:
        item = self._items.get(transfer_id)
        return item[0] if item is not None else None

    def pop(self, transfer_id: str) -> RemoteBlocks | None:
        item = self._items.pop(transfer_id, None)
        return item[0] if item is not None else None

    def add(self, message: RemoteBlocks, now: float) -> RemoteBlocks | None:
        """Buffer ``message``; the oldest announcement it evicted (the buffer is full)."""
        self._items[message.transfer_id] = (message, now)
        self._items.move_to_end(message.transfer_id)
        if len(self._items) > self._limit:
            return self._items.popitem(last=False)[1][0]
        return None

    def expire(self, now: float, ttl: float) -> int:
        """Drop the announcements older than ``ttl``; how many."""
        dropped = 0
        while self._items:
            tid, (_, arrived) = next(iter(self._items.items()))
            if now < arrived + ttl:
                break
            del self._items[tid]
            dropped += 1
        return dropped


def lease_refusal(dest: RemoteBlocks, wall_now: float, policy: TransferPolicy) -> str | None:
    """Why writes into ``dest`` may not be posted at ``wall_now`` (None: they may).

    The write-by lease is on the consumer's clock: it is shortened here by the skew
    allowance; a lease further ahead than any configuration makes is refused as absurd.
    """
    if policy.write_by_passed(dest.write_by, wall_now):
        return "the write-by lease had passed: no write was posted"
    if policy.lease_absurd(dest.write_by, wall_now):
        return f"write-by lease {dest.write_by!r} is too far in the future"
    return None


def record_end(ctx: WorkerContext, save: Push, result: TransferResult) -> None:
    """Count a push that ended (and log why, when it failed)."""
    if result.ok:
        ctx.counters.transfers_succeeded += 1
        return
    ctx.counters.transfers_failed += 1
    expired = result.outcome is Outcome.EXPIRED
    ctx.counters.transfers_expired += expired
    kind = "restarted" if not save.tell_consumer else "expired" if expired else "write"
    ctx.counters.failed(kind)
    log.warning(
        "write failed",
        transfer_id=result.transfer_id,
        request_id=save.order.request_id,
        peer=None if save.dest is None else str(save.dest.reply_to),
        reason=result.message,
    )


def another_prompt(
    ctx: WorkerContext, ours: PromptBinding | None, dest: RemoteBlocks
) -> str | None:
    """Why KV computed for the prompt ``ours`` binds may not be pushed into ``dest``'s blocks
    (None: it may; a side without a binding matches nothing). Counts and logs a refusal."""
    announced = dest.prompt
    if ours is not None and ours.matches(announced):
        return None
    if ours is not None and announced is not None and ours.scheme != announced.scheme:
        kind, reason = HandoffRefusal.PROMPT_SCHEME, scheme_refusal(ours.scheme, announced.scheme)
    else:
        kind, reason = HandoffRefusal.PROMPT_MISMATCH, "the KV was computed for another prompt"
    ctx.counters.handoffs_refused += 1
    ctx.counters.failed(kind.value)
    log.warning(
        "remote_blocks refused",
        transfer_id=dest.transfer_id,
        kind=kind.value,
        reason=reason,
        ours=None if ours is None else f"{ours.scheme}:{ours.num_tokens}",
        theirs=None if announced is None else f"{announced.scheme}:{announced.num_tokens}",
    )
    return f"{kind.value}: {reason}"


def connect_failure(save: Push, exc: PeerUnavailableError) -> str:
    """Why ``save`` fails for want of its consumer. A consumer that restarted since it
    announced the blocks is not told (the process at its address holds other data there,
    and a verdict would mean nothing to it)."""
    if isinstance(exc, PeerRestartedError):
        save.tell_consumer = False
        return f"the consumer restarted: its blocks are gone ({exc})"
    return str(exc)
