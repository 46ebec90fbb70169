"""A request as the planner's unit: every layer's blocks in as few batches as the memory allows.

vLLM allocates a KV-cache group's layers as views of one buffer. Where both peers registered
that buffer whole (a *span*) and told each other where each layer lies in it, one batch per
pair of spans carries every layer of the request, with offsets relative to the spans; each
layer's plan (:func:`~moriio.domain.kv.planner.plan_transfer`, one per geometry through the
:class:`~moriio.domain.kv.plan_cache.PlanCache`) is shifted by the layer's place and the
whole batch is merged by remote offset (:func:`~moriio.domain.kv.descriptors.merged`).

What that buys depends on the page order. Layer-outermost orders (vLLM's default) keep a
layer's pages apart from the next layer's, so the batch holds as many descriptors as the
per-layer batches together, in one post instead of one per layer. Block-outermost orders
(``BL*``) put every layer's page of a block in one row, so a block's pages of all layers
merge into one descriptor: a descriptor per block run instead of per block per layer.

A layer without a span on either side keeps a batch of its own, against its own region.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from moriio.domain.kv.descriptors import coalesce, merged
from moriio.domain.kv.geometry import LayerGeometry
from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.planner import BlockIds, TransferPlan


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a layer's region lies in a span: the span's index and the byte offset of the
    layer's region from the span's start."""

    span: int
    offset: int

    def __post_init__(self) -> None:
        if self.span < 0 or self.offset < 0:
            raise ValueError(f"a placement needs a span >= 0 and an offset >= 0, got {self}")


@dataclass(frozen=True, slots=True)
class RequestLayer:
    """One layer of a request: our geometry and the peer's block count and stride (None:
    ours), and where the layer lies on each side (None: in no span there)."""

    name: str
    geometry: LayerGeometry
    remote_num_blocks: int
    remote_block_stride: int | None = None
    local: Placement | None = None
    remote: Placement | None = None

    @property
    def spanned(self) -> bool:
        return self.local is not None and self.remote is not None


@dataclass(frozen=True, slots=True, eq=False)
class RequestBatch:
    """One post: ``plan`` between a local span and a peer span (offsets from the spans'
    starts), or between one layer's own regions when ``local_span`` is None."""

    layers: tuple[str, ...]
    plan: TransferPlan
    local_span: int | None = None
    remote_span: int | None = None


def plan_request(
    layers: Sequence[RequestLayer],
    local_block_ids: BlockIds,
    remote_block_ids: BlockIds,
    *,
    by_span: bool = True,
) -> tuple[RequestBatch, ...]:
    """The batches that move ``local_block_ids[i]`` <-> ``remote_block_ids[i]`` in every layer.

    ``by_span``: one batch per pair of spans for the layers placed in spans on both sides
    (in the order their first layer comes), then one batch per remaining layer; False: one
    batch per layer (the per-layer path, for layer-wise loads and saves). ValueError as
    :func:`~moriio.domain.kv.planner.plan_transfer` raises it.
    """
    caches: dict[int, PlanCache] = {}

    def plan_of(layer: RequestLayer) -> TransferPlan:
        cache = caches.get(layer.remote_num_blocks)
        if cache is None:
            cache = caches[layer.remote_num_blocks] = PlanCache(
                local_block_ids, remote_block_ids, layer.remote_num_blocks
            )
        return cache.plan_for(layer.geometry, layer.remote_block_stride)

    grouped: dict[tuple[int, int], list[RequestLayer]] = {}
    alone: list[RequestBatch] = []
    for layer in layers:
        if by_span and layer.local is not None and layer.remote is not None:
            grouped.setdefault((layer.local.span, layer.remote.span), []).append(layer)
        else:
            alone.append(RequestBatch((layer.name,), plan_of(layer)))
    spanned = [
        RequestBatch(
            tuple(layer.name for layer in members),
            _joined([(plan_of(layer), layer) for layer in members]),
            local_span,
            remote_span,
        )
        for (local_span, remote_span), members in grouped.items()
    ]
    return (*spanned, *alone)


def _joined(parts: Sequence[tuple[TransferPlan, RequestLayer]]) -> TransferPlan:
    """The layers' plans shifted to their places in the spans, merged by remote offset.

    Layers that share one plan (one geometry: the common case) are shifted together; the
    batch is then in remote order without a sort of the whole when the layers' pieces do not
    interleave (layer-outermost orders: layer after layer) or when each block's pieces of
    every layer lie closer together than the next block's (block-outermost: block after
    block).
    """
    plan = parts[0][0]
    if any(other is not plan for other, _ in parts):
        local = np.concatenate(
            [p.local_offsets + _place(layer.local) for p, layer in parts], dtype=np.int64
        )
        remote = np.concatenate(
            [p.remote_offsets + _place(layer.remote) for p, layer in parts], dtype=np.int64
        )
        sizes = np.concatenate([p.sizes for p, _ in parts], dtype=np.int64)
        return TransferPlan(*merged(local, remote, sizes))
    order = np.argsort(plan.remote_offsets, kind="stable")
    lo, ro, sz = plan.local_offsets[order], plan.remote_offsets[order], plan.sizes[order]
    shifts = sorted((_place(layer.remote), _place(layer.local)) for _, layer in parts)
    remote_shift = np.array([r for r, _ in shifts], dtype=np.int64)
    local_shift = np.array([lc for _, lc in shifts], dtype=np.int64)
    extent = int((ro + sz).max() - ro[0]) if ro.size else 0
    gaps = np.diff(remote_shift)
    if gaps.size and int(gaps.min()) >= extent:  # layer after layer
        outer = True
    else:
        block_gaps = np.diff(ro)
        span = int(remote_shift[-1] - remote_shift[0])
        outer = False
        if block_gaps.size and int(block_gaps.min()) <= span:
            local = (lo[None, :] + local_shift[:, None]).ravel()
            remote = (ro[None, :] + remote_shift[:, None]).ravel()
            return TransferPlan(*merged(local, remote, np.tile(sz, len(parts))))
    if outer:
        local = (lo[None, :] + local_shift[:, None]).ravel()
        remote = (ro[None, :] + remote_shift[:, None]).ravel()
        sizes = np.tile(sz, len(parts))
    else:  # block after block: every layer's piece of a block, then the next block
        local = (lo[:, None] + local_shift[None, :]).ravel()
        remote = (ro[:, None] + remote_shift[None, :]).ravel()
        sizes = np.repeat(sz, len(parts))
    return TransferPlan(*coalesce(local, remote, sizes))


def _place(placement: Placement | None) -> int:
    assert placement is not None  # grouped layers are placed on both sides
    return placement.offset


def descriptors_and_posts(batches: Sequence[RequestBatch]) -> tuple[int, int]:
    """Descriptors over all batches, and the posts that carry them (an empty batch is none)."""
    posts = [b for b in batches if b.plan.num_descriptors]
    return sum(b.plan.num_descriptors for b in posts), len(posts)
