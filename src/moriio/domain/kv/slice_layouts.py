"""Slice layouts of a layer's pages: where each KV head, and each unit of a recurrent state,
lies in a rank's block page (see :mod:`moriio.domain.kv.head_slices`).

The page view alone does not say where a head is: backends fold heads into the view in
different ways, so the engine facade names the convention (:class:`HeadOrder`) its backend
uses, and the layout follows from it and the view's strides:

* ``SLOTS``: KV head ``h`` is head slot ``h`` of the ``[nb*k, H, N, C]`` view, all ``C``
  bytes of each of its ``N`` states (packed K/V pages, scales included): heads lie together
  in HND orders, once per state in NHD orders;
* ``NVFP4``: ``2 * kv`` slots; each kernel page is ``[K data | K scales | V data | V scales]``,
  each part ``kv x N`` cells (HND) or ``N x kv`` (NHD) of ``8/9`` resp. ``1/9`` of ``C``;
* ``TILES``: 2 slots (a K plane and a V plane) of ``C = kv * D``; the kernels view a plane's
  block as ``kv`` tiles of ``N * D`` elements, head-major (its rows are not tokens);
* ``ROWS``: 2 slots of ``C = kv * D``; each state's row holds the ``kv`` heads in order.

A recurrent state is given as its parts (:class:`StatePart`): the engine facade reads how
its layer shards them, never guessing from shapes.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from moriio.domain.kv.geometry import LayerGeometry
from moriio.domain.kv.head_slices import SliceLayout, UnitPlane
from moriio.domain.kv.shards import check_shards


class HeadOrder(enum.Enum):
    """How a backend lays a page's KV heads out (see the module docstring)."""

    SLOTS = "slots"
    NVFP4 = "nvfp4"
    TILES = "tiles"
    ROWS = "rows"


def head_slices(
    geometry: LayerGeometry, order: HeadOrder, total_kv_heads: int, tp_size: int
) -> SliceLayout:
    """Where this rank's KV heads lie in a block page of ``geometry`` (a page view
    ``[nb*k, H, N, C]``); ValueError names what does not fit ``order``."""
    shape, strides, item = geometry.shape, geometry.strides, geometry.itemsize
    if len(shape) != 4:
        raise ValueError(f"KV heads are sliced in page views [nb*k, H, N, C], not {shape}")
    check_shards(total_kv_heads, tp_size, "KV heads")
    heads = max(total_kv_heads // tp_size, 1)
    slots, states, content = shape[1:]
    page, slot, state = (s * item for s in strides[:3])
    want = {HeadOrder.SLOTS: heads, HeadOrder.NVFP4: 2 * heads}.get(order, 2)
    if slots != want:
        raise ValueError(
            f"a {order.value} page of {heads} KV heads has {want} head slots, the view {slots}"
        )
    cell = content * item
    planes: list[tuple[int, int, int, int, int]] = []  # offset, unit, row stride, rows, run
    if order is HeadOrder.SLOTS:
        planes.append((0, slot, state, states, cell))
    elif order is HeadOrder.NVFP4:
        data = cell * 8 // 9
        hnd = slot == states * cell
        side = heads * states * cell
        for first, run in ((0, data), (heads * states * data, cell - data)):
            for half in (0, side):
                unit, row = (states * run, run) if hnd else (run, heads * run)
                planes.append((half + first, unit, row, states, run))
    else:
        if cell % heads:
            raise ValueError(f"a {order.value} plane of {cell} bytes holds no {heads} heads")
        run = cell // heads
        for half in (0, slot):
            if order is HeadOrder.TILES:
                planes.append((half, states * run, states * run, 1, states * run))
            else:
                planes.append((half, run, state, states, run))
    kernels = geometry.kernel_blocks_per_block
    return SliceLayout(
        tuple(
            UnitPlane(j * page + offset, unit, row, rows, run_bytes, total_kv_heads)
            for offset, unit, row, rows, run_bytes in planes
            for j in range(kernels)
        ),
        (heads,) * (len(planes) * kernels),
    )


@dataclass(frozen=True, slots=True)
class StatePart:
    """One sharded part of a rank's state page: ``units`` of ``total_units`` (heads, groups
    or channels of one sub-projection), each ``rows`` runs of ``row_bytes``, unit ``i``'s row
    ``t`` at ``offset + i * unit_stride + t * row_stride`` of the page."""

    offset: int
    unit_stride: int
    row_stride: int
    rows: int
    row_bytes: int
    units: int
    total_units: int


def state_slices(parts: Sequence[StatePart], what: str) -> SliceLayout:
    """A state page's layout from its parts; ValueError when a part does not fit the page
    order it claims (units overlapping, or more units than the state has)."""
    for part in parts:
        if part.units > part.total_units:
            raise ValueError(f"{what}: {part.units} units of {part.total_units}")
        if part.rows > 1 and part.row_stride < part.row_bytes:
            raise ValueError(f"{what}: rows of {part.row_bytes} bytes overlap")
    return SliceLayout(
        tuple(
            UnitPlane(p.offset, p.unit_stride, p.row_stride, p.rows, p.row_bytes, p.total_units)
            for p in parts
        ),
        tuple(p.units for p in parts),
        what,
    )
