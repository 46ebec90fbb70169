"""Whether two peers' shards line up, layer by layer, when their TP sizes differ.

Checked on the regions a peer sends in its handshake: the same planes, rows, run bytes and
total units on both sides, each TP size sharding them evenly (see
:mod:`moriio.domain.kv.head_slices`); a layer that cannot be sliced moves between different
TP sizes only where every rank holds every head (MLA's latent, replicated heads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from moriio.domain.kv.head_slices import (
    GroupSlicing,
    SliceLayout,
    Unsliceable,
    check_slices,
)
from moriio.domain.kv.tp import check_kv_head_replication
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.tp_compat import tp_pair_problem


def check_sliced_layers(
    ours: Mapping[str, tuple[Sequence[GroupSlicing], int]],
    theirs: Iterable[LayerRegions],
    our_tp: int,
    their_tp: int,
    *,
    total_kv_heads: int,
    is_mla: bool,
) -> None:
    """Raise ValueError naming the first layer (and group) whose shards would not line up
    between ranks of TP ``our_tp`` and ``their_tp``. ``ours``: each layer's slicing and
    block length."""
    problem = tp_pair_problem(our_tp, their_tp)
    if problem is not None:
        raise ValueError(problem)
    for layer in theirs:
        local = ours.get(layer.name)
        if local is None:
            continue
        slicing, block_len = local
        if not slicing:
            _whole_pages(layer, block_len, our_tp, their_tp, total_kv_heads, is_mla)
            continue
        if len(layer.slices) not in (0, len(slicing)):
            raise ValueError(
                f"layer {layer.name!r}: {len(slicing)} KV-cache groups here, "
                f"{len(layer.slices)} there"
            )
        for g, mine in enumerate(slicing):
            wire = layer.slices[g] if layer.slices else ()
            where = f"layer {layer.name!r}, group {g}"
            if isinstance(mine, Unsliceable):
                if min(our_tp, their_tp) < total_kv_heads and not is_mla:
                    raise ValueError(f"{where} cannot be sliced between TP sizes: {mine.reason}")
                _same_length(layer, block_len)
            elif mine is None:
                if wire:
                    raise ValueError(f"{where}: the peer slices pages this rank holds whole")
                _same_length(layer, block_len)
            elif not wire:
                raise ValueError(f"{where}: the peer moves only whole pages of {mine.what}")
            else:
                try:
                    check_slices(mine, SliceLayout.from_wire(wire), our_tp, their_tp)
                except ValueError as exc:
                    raise ValueError(f"{where}: {exc}") from None


def _whole_pages(
    layer: LayerRegions,
    block_len: int,
    our_tp: int,
    their_tp: int,
    total_kv_heads: int,
    is_mla: bool,
) -> None:
    """A layer without slicing facts moves whole pages: only between ranks that hold every
    head (MLA, or replicated heads)."""
    try:
        check_kv_head_replication(our_tp, their_tp, total_kv_heads, is_mla)
    except (ValueError, NotImplementedError) as exc:
        raise ValueError(f"layer {layer.name!r}: {exc}") from None
    _same_length(layer, block_len)


def _same_length(layer: LayerRegions, block_len: int) -> None:
    if layer.block_len != block_len:
        raise ValueError(
            f"layer {layer.name!r} block_len differs (ours={block_len}, theirs={layer.block_len})"
        )
