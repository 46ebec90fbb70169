"""A request batch through bounded staging regions: gather, a few large descriptors, scatter.

The sender copies the batch's pieces one after another into its staging region (the
*gather*), the transport moves the filled part of that region to the receiver's staging
region as one descriptor, and the receiver copies each piece out to where it belongs (the
*scatter*). A batch larger than the region takes several fills; a piece that straddles a
fill's end is cut in two. Both peers cut the same fills from the same batch, so they agree
on every staging offset without telling each other.

Offsets: ``gather`` reads the *source* side's offsets (the batch's remote offsets for a
READ, its local offsets for a WRITE) into staging offsets; ``scatter`` writes staging
offsets to the *destination* side's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from moriio.domain.kv.descriptors import Int64s
from moriio.domain.kv.planner import TransferPlan


@dataclass(frozen=True, slots=True, eq=False)
class Segments:
    """``sizes[i]`` bytes from ``src[i]`` to ``dst[i]`` (read-only int64 arrays)."""

    src: Int64s
    dst: Int64s
    sizes: Int64s

    def __post_init__(self) -> None:
        for array in (self.src, self.dst, self.sizes):
            array.flags.writeable = False

    @property
    def count(self) -> int:
        return int(self.sizes.size)


@dataclass(frozen=True, slots=True, eq=False)
class StagedFill:
    """One fill of the staging regions: ``length`` bytes from offset 0 of each."""

    gather: Segments  # source offsets -> staging offsets
    scatter: Segments  # staging offsets -> destination offsets
    length: int


def stage(
    source: Int64s, destination: Int64s, sizes: Int64s, capacity: int
) -> tuple[StagedFill, ...]:
    """Cut the pieces (``sizes[i]`` bytes from ``source[i]`` to ``destination[i]``, in this
    order) into fills of at most ``capacity`` bytes. ValueError for a capacity below 1."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"a staging region needs a capacity of at least 1 byte, got {capacity!r}")
    if sizes.size == 0:
        return ()
    ends = np.cumsum(sizes)
    starts = ends - sizes
    total = int(ends[-1])
    # Cut points: every multiple of the capacity inside the batch, plus each piece's start.
    cuts = np.arange(capacity, total, capacity, dtype=np.int64)
    bounds = np.union1d(starts, cuts)
    piece = np.searchsorted(starts, bounds, side="right") - 1
    offset_in_piece = bounds - starts[piece]
    lengths = np.diff(np.append(bounds, total))
    src = source[piece] + offset_in_piece
    dst = destination[piece] + offset_in_piece
    fill = bounds // capacity
    staging = bounds - fill * capacity
    edges = np.searchsorted(fill, np.arange(int(fill[-1]) + 2), side="left")
    fills = []
    for first, last in zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True):
        at = slice(first, last)
        length = int(lengths[at].sum())
        fills.append(
            StagedFill(
                Segments(src[at], staging[at], lengths[at]),
                Segments(staging[at], dst[at], lengths[at]),
                length,
            )
        )
    return tuple(fills)


def stage_plan(plan: TransferPlan, capacity: int, *, read: bool) -> tuple[StagedFill, ...]:
    """:func:`stage` of a request batch: for a READ the peer's (remote) offsets are the
    source and ours the destination; for a WRITE the other way round."""
    if read:
        return stage(plan.remote_offsets, plan.local_offsets, plan.sizes, capacity)
    return stage(plan.local_offsets, plan.remote_offsets, plan.sizes, capacity)
