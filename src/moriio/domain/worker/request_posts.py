"""A transfer's posts: one batch per pair of spans for a whole request, or one per layer.

The per-layer path stays for what waits layer by layer (a layer-wise READ's forward, a WRITE
save posted as each layer is computed); everything else moves as a request
(:mod:`moriio.domain.kv.request_plan`).
"""

from __future__ import annotations

from collections.abc import Iterable

from moriio.domain.kv.planner import BlockIds
from moriio.domain.kv.request_plan import RequestBatch, RequestLayer, plan_request
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.peer_checks import ConnectedPeer
from moriio.domain.worker.poster import PostRequest
from moriio.ports import TransferOp


def request_posts(
    transfer_id: str,
    op: TransferOp,
    kv: LocalKV,
    peer: ConnectedPeer,
    local_block_ids: BlockIds,
    remote_block_ids: BlockIds,
    *,
    names: Iterable[str] | None = None,
    by_span: bool = True,
) -> list[PostRequest]:
    """The posts that move the blocks in every layer of ``names`` (default: all of ours).

    ``by_span``: one post per pair of spans for the layers both peers placed in spans, one
    per other layer; False: one post per layer. ValueError names a layer the peer lacks, or
    what the planner refuses.
    """
    layers = []
    for name in kv.names if names is None else names:
        local = kv.get(name)
        remote = peer.layers.get(name)
        if local is None or remote is None:
            raise ValueError(f"peer {peer.address} has no KV layer {name!r}")
        layers.append(
            RequestLayer(
                name,
                local.geometry,
                remote.num_blocks,
                remote.block_stride,
                local.placement,
                remote.placement,
            )
        )
    batches = plan_request(layers, local_block_ids, remote_block_ids, by_span=by_span)
    return [_post(transfer_id, op, kv, peer, batch) for batch in batches]


def _post(
    transfer_id: str, op: TransferOp, kv: LocalKV, peer: ConnectedPeer, batch: RequestBatch
) -> PostRequest:
    layers = batch.layers
    if batch.local_span is None or batch.remote_span is None:
        (name,) = layers
        local = kv.get(name)
        assert local is not None  # planned from our own layers
        return PostRequest(
            transfer_id, name, op, local.region, peer.layers[name].region, batch.plan
        )
    label = layers[0] if len(layers) == 1 else f"{layers[0]}..{layers[-1]}"
    return PostRequest(
        transfer_id,
        label,
        op,
        kv.spans[batch.local_span],
        peer.spans[batch.remote_span],
        batch.plan,
        layers,
    )
