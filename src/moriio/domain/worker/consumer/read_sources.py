"""The producer ranks a READ takes its KV from, and its posts when their TP size differs.

With equal TP sizes a consumer rank reads from the producer rank of its own index. With
different sizes it reads every unit (KV head, state shard) it holds from the first producer
rank of its group that holds it (:mod:`moriio.domain.kv.shards`): one producer rank when
the consumer's TP is larger (a slice of each of its pages), several when the producer's is
(each page gathered from their pages); pages every rank holds whole (MLA's latent,
replicated heads) from the first rank of the group only. Every rank of the group is still
released, once.
"""

from __future__ import annotations

from moriio.domain.kv.shards import producer_group
from moriio.domain.kv.slice_plans import RankPair, SlicedPlans
from moriio.domain.params.orders import ReadOrder
from moriio.domain.worker.consumer.handoff_checks import source_address
from moriio.domain.worker.context import WorkerContext
from moriio.domain.worker.peer_checks import ConnectedPeer
from moriio.domain.worker.poster import PostRequest
from moriio.ports import PeerAddress, TransferOp


def source_ranks(ctx: WorkerContext, peer_tp: int) -> tuple[int, ...]:
    """The producer ranks this consumer rank reads from (ValueError: sizes do not pair)."""
    group = producer_group(ctx.tp_rank, ctx.tp_size, peer_tp)
    if peer_tp == ctx.tp_size:
        return (ctx.tp_rank,)
    slicing = [layer.slicing for layer in ctx.kv]
    found = tuple(
        rank for rank in group if any(_pair(ctx, rank, peer_tp).moves_anything(s) for s in slicing)
    )
    return found or (group.start,)


def source_addresses(
    ctx: WorkerContext, order: ReadOrder, ranks: tuple[int, ...]
) -> tuple[PeerAddress, ...]:
    """The handshake addresses of producer ranks ``ranks`` of ``order``'s producer."""
    peer_tp = order.peer.tp_size or ctx.tp_size
    return tuple(source_address(ctx, order.peer, rank, peer_tp) for rank in ranks)


def plan_sliced_reads(
    ctx: WorkerContext, order: ReadOrder, peer: ConnectedPeer, rank: int
) -> list[PostRequest]:
    """One READ post per local layer of what producer rank ``rank`` (``peer``) moves to this
    rank; ValueError names a layer the peer lacks or that cannot be sliced."""
    peer_tp = order.peer.tp_size or ctx.tp_size
    pair = _pair(ctx, rank, peer_tp)
    caches: dict[int, SlicedPlans] = {}
    posts = []
    for layer in ctx.kv:
        remote = peer.layers.get(layer.name)
        if remote is None:
            raise ValueError(f"peer {peer.address} has no KV layer {layer.name!r}")
        plans = caches.get(remote.num_blocks)
        if plans is None:
            plans = caches[remote.num_blocks] = SlicedPlans(
                order.local_block_ids,
                order.remote_block_ids,
                order.group_sizes,
                remote.num_blocks,
                pair,
            )
        geometry = layer.geometry
        plan = plans.plan_for(
            layer.name,
            geometry,
            layer.slicing,
            remote.slicing,
            remote.block_len,
            remote.block_stride or geometry.block_stride_bytes,
        )
        posts.append(
            PostRequest(
                order.transfer_id, layer.name, TransferOp.READ, layer.region, remote.region, plan
            )
        )
    return posts


def _pair(ctx: WorkerContext, rank: int, peer_tp: int) -> RankPair:
    return RankPair(ctx.tp_rank, ctx.tp_size, rank, peer_tp, local_consumes=True)
