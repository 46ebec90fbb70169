"""A WRITE push in progress, and the write-by lease that bounds it."""

from __future__ import annotations

from dataclasses import dataclass, field

from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.ledgers.outcome import TransferResult
from moriio.domain.timing.policy import MAX_LEASE_SECONDS
from moriio.domain.wire.messages import RemoteBlocks
from moriio.domain.wire.orders import SaveOrder
from moriio.domain.wire.transfer_params import port_offset
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.peers import ConnectedPeer
from moriio.ports import PeerAddress


@dataclass(slots=True)
class Push:
    """One WRITE transfer being pushed: its order, the consumer's blocks, its progress."""

    order: SaveOrder
    deadline: float
    dest: RemoteBlocks | None = None
    peer: ConnectedPeer | None = None
    plans: PlanCache | None = None
    forward: int = 0  # the forward (numbered by the pusher) that computes its KV
    forward_done: bool = False  # that forward has finished
    tell_consumer: bool = True  # False: the consumer instance is gone, no verdict to send
    ending: TransferResult | None = None
    posted: set[str] = field(default_factory=set)
    quarantined: bool = False  # a batch's bytes may still land: the verdict waits for it


def lease_refusal(dest: RemoteBlocks, wall_now: float, skew_allowance: float) -> str | None:
    """Why writes into ``dest`` may not be posted at ``wall_now`` (None: they may).

    The write-by lease is on the consumer's clock: it is shortened here by the skew
    allowance; a lease further ahead than any configuration makes is refused as absurd.
    """
    if wall_now + skew_allowance >= dest.write_by:
        return "the write-by lease had passed: no write was posted"
    if dest.write_by > wall_now + skew_allowance + MAX_LEASE_SECONDS:
        return f"write-by lease {dest.write_by!r} is too far in the future"
    return None


def verdict_target(save: Push, ctx: WorkerContext) -> PeerAddress | None:
    """Where the push's verdict goes: the announcement's reply address, else the consumer
    worker of this rank named in the order (None: nobody to tell)."""
    if not save.tell_consumer:
        return None
    if save.dest is not None:
        return save.dest.reply_to
    peer = save.order.peer
    if peer is None:
        return None
    tp = peer.tp_size or ctx.tp_size
    offset = port_offset(peer.dp_rank, ctx.tp_rank, tp, ctx.pp_rank, ctx.pp_size)
    return PeerAddress(peer.host, peer.notify_port + offset)
