"""A request described by its size, planned for real: the :class:`Scenario` the cost model
weighs, with descriptor counts taken from the planner rather than from a formula.

Each layer is a page view ``[nb, H, 1, C]`` of bytes (``H`` = 1: one chunk per block, the
whole page; ``H`` = 2: a K plane and a V plane, two chunks per block) in vLLM's
layer-outermost order (``LBHNC``, or ``LHBNC`` for two planes) or block-outermost order
(``BLHNC`` / ``BHLNC``: every layer's page of a block in one row). Both peers hold
``cache_blocks`` blocks; the request's ids on each side are drawn without repeats (seeded)
or run contiguously.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from moriio.domain.kv.geometry import LayerSpec
from moriio.domain.kv.layout import describe_layout
from moriio.domain.kv.path_costs import Scenario
from moriio.domain.kv.request_plan import (
    Placement,
    RequestLayer,
    descriptors_and_posts,
    plan_request,
)
from moriio.ports import MemoryKind

Order = Literal["random", "contiguous"]
ORDERS: tuple[Order, ...] = ("random", "contiguous")


def _layer_strides(
    cache_blocks: int, layers: int, planes: int, chunk: int, block_outer: bool
) -> tuple[tuple[int, int, int, int], int, int]:
    """Strides of one layer's ``[nb, H, 1, C]`` view, the step between layers' offsets,
    and the bytes of the whole buffer."""
    if block_outer:  # [B, H, L, N, C]: a block's row holds every layer's planes
        row = planes * layers * chunk
        return (row, layers * chunk, chunk, 1), chunk, cache_blocks * row
    if planes == 1:  # [L, B, H, N, C]
        return (chunk, chunk, chunk, 1), cache_blocks * chunk, layers * cache_blocks * chunk
    plane = cache_blocks * chunk  # [L, H, B, N, C]: a K plane, then a V plane, per layer
    return (chunk, plane, chunk, 1), planes * plane, layers * planes * plane


def request_scenario(
    *,
    layers: int,
    blocks: int,
    block_bytes: int,
    memory: MemoryKind,
    same_host: bool,
    order: Order = "random",
    block_outer: bool = False,
    chunks_per_block: int = 1,
    cache_blocks: int | None = None,
    staging_bytes: int = 0,
    layerwise: bool = False,
    same_host_copies: bool = True,
    seed: int = 0,
) -> Scenario:
    """The scenario of moving ``blocks`` blocks of ``layers`` layers (``block_bytes`` per
    layer and block, split in ``chunks_per_block`` chunks), with ``runs`` and ``row_runs``
    counted by the planner. ValueError names a bad argument."""
    for name, value in (("layers", layers), ("blocks", blocks), ("block_bytes", block_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if chunks_per_block not in (1, 2):
        raise ValueError(
            f"chunks_per_block must be 1 (a page) or 2 (K and V), got {chunks_per_block}"
        )
    if block_bytes % chunks_per_block:
        raise ValueError(f"block_bytes {block_bytes} do not split into {chunks_per_block} chunks")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    nb = 4 * blocks if cache_blocks is None else cache_blocks
    if nb < blocks:
        raise ValueError(f"cache_blocks {nb} is below the {blocks} blocks the request moves")
    chunk = block_bytes // chunks_per_block
    strides, step, _ = _layer_strides(nb, layers, chunks_per_block, chunk, block_outer)
    spec = LayerSpec(
        block_size=1, num_kv_heads=chunks_per_block, head_size=None, content_bytes=chunk
    )
    geometry = describe_layout((nb, chunks_per_block, 1, chunk), strides, 1, spec)
    rng = np.random.default_rng(seed)
    if order == "random":
        local, remote = (rng.choice(nb, blocks, replace=False) for _ in range(2))
    else:
        local = remote = np.arange(blocks)
    request = [
        RequestLayer(
            f"layer{i}", geometry, nb, None, Placement(0, i * step), Placement(0, i * step)
        )
        for i in range(layers)
    ]
    (first,) = plan_request(request[:1], local, remote, by_span=False)
    (whole,) = plan_request(request, local, remote)
    row_runs, _ = descriptors_and_posts((whole,))
    return Scenario(
        layers=layers,
        blocks=blocks,
        chunk_bytes=chunk,
        memory=memory,
        same_host=same_host,
        chunks_per_block=chunks_per_block,
        runs=first.plan.num_descriptors,
        row_runs=row_runs,
        staging_bytes=staging_bytes,
        layerwise=layerwise,
        same_host_copies=same_host_copies,
    )
