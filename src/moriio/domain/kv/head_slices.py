"""Where a rank's shard of a block page lies, and the byte copies that move part of it.

When two peers' TP sizes differ and their KV heads (or a recurrent state) are split across
ranks, a block page of one rank holds a different set of heads than a page of the other: a
transfer moves, per block, the bytes of the heads both ranks hold. A :class:`SliceLayout`
says where those bytes are, as planes of units (a unit is a KV head, or one head of a state's
sub-projection, see :mod:`moriio.domain.kv.shards`):

* a plane's unit ``i`` (the ``i``-th unit this rank holds) has ``rows`` runs of
  ``row_bytes`` bytes, row ``t`` at ``offset + i * unit_stride + t * row_stride`` from the
  start of the block (block ``b`` starts ``b * block_stride`` into the layer's region);
* every plane of a page shards the same way; planes differ in what they hold (K and V halves
  stored apart, data and scales, each kernel block of a split block, each sub-projection of
  a convolution state) and in their unit count.

Both peers describe their own pages (the handshake carries the layouts); slicing needs the
same planes on both sides, each with the same rows, run bytes and total units
(:func:`check_slices`). :func:`slice_template` pairs the runs of the units one rank moves to
another, in one block, coalescing runs contiguous on both sides (so a rank's heads that lie
together in a page move as one descriptor per block, e.g. HND pages), and
:func:`plan_slices` lays that template over every block pair.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeAlias

import numpy as np

from moriio.domain.kv.planner import BlockIds, Int64Array, TransferPlan, as_block_ids
from moriio.domain.kv.shards import check_shards

PLANE_FIELDS = 6  # ints per plane on the wire
MAX_PLANES = 64


@dataclass(frozen=True, slots=True)
class UnitPlane:
    """One plane of a rank's page: see the module docstring. ``units``: how many units of
    the plane this rank holds; ``total_units``: how many every rank holds together."""

    offset: int
    unit_stride: int
    row_stride: int
    rows: int
    row_bytes: int
    total_units: int

    def __post_init__(self) -> None:
        for name in ("offset", "unit_stride", "row_stride"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"plane {name} must be an int >= 0, got {value!r}")
        for name in ("rows", "row_bytes", "total_units"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"plane {name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class SliceLayout:
    """A rank's shard of one page kind (attention KV, or one group's state) in one layer.

    ``units``: the units this rank holds in each plane (in plane order); ``what``: what a unit
    is, for messages (``KV heads``, ``gdn state``).
    """

    planes: tuple[UnitPlane, ...]
    units: tuple[int, ...]
    what: str = "KV heads"

    def __post_init__(self) -> None:
        if not self.planes or len(self.planes) > MAX_PLANES:
            raise ValueError(f"a slice layout needs 1..{MAX_PLANES} planes")
        if len(self.units) != len(self.planes):
            raise ValueError("one unit count per plane is required")
        for plane, held in zip(self.planes, self.units, strict=True):
            if isinstance(held, bool) or not isinstance(held, int) or held < 1:
                raise ValueError(f"units held must be positive ints, got {held!r}")
            if held > plane.total_units:
                raise ValueError(f"a rank holds {held} of {plane.total_units} units")

    def to_wire(self) -> tuple[int, ...]:
        """``[held, offset, unit_stride, row_stride, rows, row_bytes, total]`` per plane."""
        out: list[int] = []
        for plane, held in zip(self.planes, self.units, strict=True):
            out += [held, plane.offset, plane.unit_stride, plane.row_stride, plane.rows]
            out += [plane.row_bytes, plane.total_units]
        return tuple(out)

    @classmethod
    def from_wire(cls, values: Sequence[int], what: str = "KV heads") -> SliceLayout:
        """The layout :meth:`to_wire` wrote; ValueError for anything else."""
        width = PLANE_FIELDS + 1
        if not values or len(values) % width:
            raise ValueError(f"a slice layout is {width} ints per plane, got {len(values)}")
        chunks = [tuple(values[i : i + width]) for i in range(0, len(values), width)]
        return cls(
            tuple(UnitPlane(*chunk[1:]) for chunk in chunks), tuple(c[0] for c in chunks), what
        )


@dataclass(frozen=True, slots=True)
class Unsliceable:
    """A page kind whose shard cannot be sliced correctly, and why (refused when the peers'
    TP sizes differ)."""

    reason: str


GroupSlicing: TypeAlias = SliceLayout | Unsliceable | None
"""How one KV-cache group's pages of a layer shard: a layout, a reason they cannot be sliced,
or None when every rank holds the whole page (MLA's latent, a replicated state)."""


class Share(NamedTuple):
    """The units one rank moves to another: per plane, a range of global unit indices, and
    where each side's first held unit is (``ours``/``theirs``: global index of unit 0)."""

    moved: tuple[range, ...]
    ours: tuple[int, ...]
    theirs: tuple[int, ...]


def check_slices(ours: SliceLayout, theirs: SliceLayout, our_tp: int, their_tp: int) -> None:
    """Raise ValueError naming the first mismatch that keeps two ranks' shards from lining
    up: the planes, a plane's rows, run bytes or total units, or units that do not shard
    evenly over either TP size."""
    if len(ours.planes) != len(theirs.planes):
        raise ValueError(
            f"{ours.what} lie in {len(ours.planes)} planes here and {len(theirs.planes)} there"
        )
    for i, (a, b) in enumerate(zip(ours.planes, theirs.planes, strict=True)):
        for name in ("rows", "row_bytes", "total_units"):
            if getattr(a, name) != getattr(b, name):
                raise ValueError(
                    f"{ours.what}, plane {i}: {name} differs "
                    f"(ours={getattr(a, name)}, theirs={getattr(b, name)})"
                )
        check_shards(a.total_units, our_tp, f"{ours.what} (plane {i})")
        check_shards(a.total_units, their_tp, f"{ours.what} (plane {i})")
    for layout, tp, side in ((ours, our_tp, "ours"), (theirs, their_tp, "theirs")):
        for i, (plane, held) in enumerate(zip(layout.planes, layout.units, strict=True)):
            want = max(plane.total_units // tp, 1)
            if held != want:
                raise ValueError(
                    f"{ours.what}, plane {i}: {side} holds {held} of {plane.total_units} "
                    f"units, not the {want} TP {tp} gives a rank"
                )


def slice_template(
    local: SliceLayout, remote: SliceLayout, share: Share
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """``(local, remote, sizes)`` byte runs, relative to one block's start on each side,
    moving ``share``'s units; sorted by local offset, coalesced where contiguous on both."""
    los: list[Int64Array] = []
    ros: list[Int64Array] = []
    sizes: list[Int64Array] = []
    for lp, rp, moved, mine, theirs in zip(
        local.planes, remote.planes, share.moved, share.ours, share.theirs, strict=True
    ):
        if not moved:
            continue
        units = np.arange(moved.start, moved.stop, dtype=np.int64)
        rows = np.arange(lp.rows, dtype=np.int64)
        lo = lp.offset + (units - mine)[:, None] * lp.unit_stride + rows[None, :] * lp.row_stride
        ro = rp.offset + (units - theirs)[:, None] * rp.unit_stride + rows[None, :] * rp.row_stride
        los.append(lo.ravel())
        ros.append(ro.ravel())
        sizes.append(np.full(lo.size, lp.row_bytes, dtype=np.int64))
    if not los:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty.copy(), empty.copy()
    lo_all, ro_all, size_all = np.concatenate(los), np.concatenate(ros), np.concatenate(sizes)
    order = np.argsort(lo_all, kind="stable")
    return _coalesce(lo_all[order], ro_all[order], size_all[order])


def _coalesce(
    lo: Int64Array, ro: Int64Array, sizes: Int64Array
) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Merge each run into the previous one where both sides continue it."""
    if lo.size < 2:
        return lo, ro, sizes
    joins = (lo[:-1] + sizes[:-1] == lo[1:]) & (ro[:-1] + sizes[:-1] == ro[1:])
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    return lo[starts], ro[starts], np.add.reduceat(sizes, starts)


def plan_slices(
    template: tuple[Int64Array, Int64Array, Int64Array],
    local_block_ids: BlockIds,
    remote_block_ids: BlockIds,
    local_stride: int,
    remote_stride: int,
) -> TransferPlan:
    """The template laid over each ``(local, remote)`` block pair, block after block."""
    local = as_block_ids(local_block_ids, "local")
    remote = as_block_ids(remote_block_ids, "remote")[: local.size]
    lo, ro, size = template
    if not local.size or not size.size:
        empty = np.zeros(0, dtype=np.int64)
        return TransferPlan(empty, empty.copy(), empty.copy())
    local_offsets = (local[:, None] * local_stride + lo[None, :]).ravel()
    remote_offsets = (remote[:, None] * remote_stride + ro[None, :]).ravel()
    return TransferPlan(local_offsets, remote_offsets, np.tile(size, local.size))
