"""A split-head transfer between ranks of different TP sizes, as data and as text.

For ``moriio plan --explain --tp N --peer-tp M``: the given view is this rank's; the peer
rank's holds its own share of the same heads (its head slots, or its planes' content, scaled
by the TP ratio) in the same page order. Says which heads each rank holds, which move, where
they lie in each page (planes), and the plan: descriptors per block stay those of one rank's
heads (one per block where they lie together, as in HND pages), never one per head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from moriio.domain.kv.head_slices import SliceLayout
from moriio.domain.kv.layout import LayerGeometry, LayerSpec, describe_layout
from moriio.domain.kv.shards import rank_units
from moriio.domain.kv.slice_layouts import HeadOrder, head_slices
from moriio.domain.kv.slice_plans import RankPair, SlicedPlans
from moriio.plan import contiguous_strides, dtype_itemsize, page_order_strides

HEAD_ORDERS = tuple(order.value for order in HeadOrder)


def peer_view(
    shape: Sequence[int], order: HeadOrder, heads: int, peer_heads: int
) -> tuple[int, ...]:
    """The peer rank's ``[B, H, N, C]`` shape for ``peer_heads`` heads (ours: ``heads``)."""
    b, slots, n, content = shape
    if order is HeadOrder.SLOTS:
        return b, peer_heads, n, content
    if order is HeadOrder.NVFP4:
        return b, 2 * peer_heads, n, content
    if content * peer_heads % heads:
        raise ValueError(f"a plane of {content} elements does not hold {heads} heads evenly")
    return b, slots, n, content * peer_heads // heads


def _geometry(
    shape: Sequence[int], page_order: str | None, itemsize: int, spec: LayerSpec
) -> LayerGeometry:
    strides = page_order_strides(shape, page_order) if page_order else contiguous_strides(shape)
    return describe_layout(tuple(shape), strides, itemsize, spec)


def _layout_report(layout: SliceLayout) -> list[dict[str, int]]:
    return [
        {
            "offset": p.offset,
            "unit_stride": p.unit_stride,
            "row_stride": p.row_stride,
            "rows": p.rows,
            "row_bytes": p.row_bytes,
            "units": held,
        }
        for p, held in zip(layout.planes, layout.units, strict=True)
    ]


def explain_split(
    *,
    shape: Sequence[int],
    dtype: str,
    spec: LayerSpec,
    page_order: str | None,
    head_order: str,
    total_kv_heads: int,
    tp: int,
    rank: int,
    peer_tp: int,
    peer_rank: int,
    local_block_ids: Sequence[int],
    remote_block_ids: Sequence[int],
    remote_num_blocks: int | None,
    consumer: bool = True,
) -> dict[str, Any]:
    """The split as one plain dict; ValueError names whatever is wrong with the input."""
    order = HeadOrder(head_order)
    itemsize = dtype_itemsize(dtype)
    heads = max(total_kv_heads // tp, 1)
    peer_heads = max(total_kv_heads // peer_tp, 1)
    ours = _geometry(shape, page_order, itemsize, spec)
    theirs_shape = peer_view(shape, order, heads, peer_heads)
    peer_spec = LayerSpec(spec.block_size, None, None, spec.kind, None, spec.num_states, None)
    theirs = _geometry(theirs_shape, page_order, itemsize, peer_spec)
    local, remote = (
        head_slices(ours, order, total_kv_heads, tp),
        head_slices(theirs, order, total_kv_heads, peer_tp),
    )
    pair = RankPair(rank, tp, peer_rank, peer_tp, local_consumes=consumer)
    peer_blocks = remote_num_blocks or theirs.num_blocks
    plans = SlicedPlans(local_block_ids, remote_block_ids, (), peer_blocks, pair)
    plan = plans.plan_for(
        "layer", ours, (local,), (remote,), theirs.block_len, theirs.block_stride_bytes
    )
    moved = pair.share(local).moved[0]
    pairs = len(local_block_ids)
    return {
        "heads": {
            "total": total_kv_heads,
            "order": order.value,
            "ours": list(rank_units(rank, tp, total_kv_heads)),
            "theirs": list(rank_units(peer_rank, peer_tp, total_kv_heads)),
            "moved": list(moved),
            "tp": tp,
            "rank": rank,
            "peer_tp": peer_tp,
            "peer_rank": peer_rank,
            "peer_shape": list(theirs_shape),
        },
        "planes": {"ours": _layout_report(local), "theirs": _layout_report(remote)},
        "plan": {
            "pairs": pairs,
            "descriptors": plan.num_descriptors,
            "per_block": plan.num_descriptors / pairs if pairs else 0.0,
            "per_head_and_row": pairs * len(moved) * sum(p.rows for p in local.planes),
            "total_bytes": plan.total_bytes,
            "rows": [list(r) for r in zip(*plan.to_lists(), strict=True)],
        },
    }


def _span(heads: Sequence[int]) -> str:
    if not heads:
        return "none"
    return str(heads[0]) if len(heads) == 1 else f"{heads[0]}-{heads[-1]}"


def render_split(report: dict[str, Any], *, rows: int = 10) -> str:
    """Human-readable split."""
    h, planes, plan = report["heads"], report["planes"], report["plan"]
    lines = [
        "split",
        f"  KV heads      {h['total']} in all, {h['order']} order",
        f"  this rank     TP {h['tp']} rank {h['rank']}: heads {_span(h['ours'])}",
        f"  peer rank     TP {h['peer_tp']} rank {h['peer_rank']}: heads "
        f"{_span(h['theirs'])} (view {h['peer_shape']})",
        f"  moved         heads {_span(h['moved'])}",
    ]
    for side in ("ours", "theirs"):
        for i, p in enumerate(planes[side]):
            lines.append(
                f"  plane {i} {side:<6} offset {p['offset']} B, head stride {p['unit_stride']} B, "
                f"{p['rows']} x {p['row_bytes']} B rows {p['row_stride']} B apart"
            )
    lines.append(
        f"plan: {plan['pairs']} block pairs -> {plan['descriptors']} descriptors "
        f"({plan['per_block']:g} per block, not {plan['per_head_and_row']} for every head's "
        f"every row alone), {plan['total_bytes']} B"
    )
    for i, (lo, ro, size) in enumerate(plan["rows"][: max(rows, 0)]):
        lines.append(f"  {i:>3}  local {lo:>10}  remote {ro:>10}  size {size}")
    if len(plan["rows"]) > rows:
        lines.append(f"  ... {len(plan['rows']) - rows} more descriptors")
    return "\n".join(lines)
