"""A batch of (destination offset, source offset, size) descriptors as equal rows.

The descriptors of a batch (bytes) are cut into units of their greatest common divisor (a
KV block's bytes in one layer, or a multiple of it): row ``src[i]`` of the source goes to
row ``dst[i]`` of the destination. A kernel then moves every row of the batch at once, all
layers and K/V halves of a request included when the batch holds them. Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MIN_UNIT_BYTES = 64  # finer descriptors are copied one by one
INT32_ROWS = (1 << 31) - 1  # row numbers below this are kept as int32
WIDTHS = (8, 4, 2, 1)  # element widths a row may be viewed as, widest first

Int64s = npt.NDArray[np.int64]
Indices = npt.NDArray[np.int32] | npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """A batch as rows of ``unit`` bytes: row ``src[i]`` goes to row ``dst[i]`` (int32
    where every row number fits, int64 otherwise)."""

    unit: int
    src: Indices
    dst: Indices

    @property
    def rows(self) -> int:
        return len(self.src)


def _narrow(rows: Int64s) -> Indices:
    if len(rows) and int(rows.max()) > INT32_ROWS:
        return rows
    return rows.astype(np.int32)


def unit_plan(src_offsets: Int64s, dst_offsets: Int64s, sizes: Int64s) -> UnitPlan | None:
    """The batch cut into equal rows, or None when its granularity is finer than
    :data:`MIN_UNIT_BYTES`."""
    if not len(sizes):
        return None
    first = int(sizes[0])
    same = bool((sizes == first).all())  # KV batches: usually one block size
    unit = first if same else int(np.gcd.reduce(np.unique(sizes)))
    if ((src_offsets % unit) | (dst_offsets % unit)).any():
        offsets = np.unique(np.concatenate([src_offsets, dst_offsets]))
        unit = int(np.gcd.reduce(np.append(offsets, unit)))
    if unit < MIN_UNIT_BYTES:
        return None
    counts = sizes // unit
    if int(counts.max()) == 1:  # one row per descriptor: the common scattered batch
        return UnitPlan(unit, _narrow(src_offsets // unit), _narrow(dst_offsets // unit))
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(total, dtype=np.int64) - starts
    src = np.repeat(src_offsets // unit, counts) + within
    dst = np.repeat(dst_offsets // unit, counts) + within
    return UnitPlan(unit, _narrow(src), _narrow(dst))


def coalesced(src: Int64s, dst: Int64s, sizes: Int64s) -> tuple[Int64s, Int64s, Int64s]:
    """Descriptors that continue the previous one on both sides, merged into it."""
    if len(sizes) < 2:
        return src, dst, sizes
    follows = (src[1:] == src[:-1] + sizes[:-1]) & (dst[1:] == dst[:-1] + sizes[:-1])
    if not follows.any():
        return src, dst, sizes
    starts = np.flatnonzero(np.concatenate([[True], ~follows]))
    merged = np.add.reduceat(sizes, starts)
    return src[starts], dst[starts], merged.astype(np.int64)


def element_width(unit: int, *addresses: int) -> int:
    """The widest element (bytes) that divides ``unit`` and every address: a row is then
    moved as whole elements of that width, never byte by byte."""
    for width in WIDTHS:
        if unit % width == 0 and all(address % width == 0 for address in addresses):
            return width
    return 1


def run_start(rows: Indices) -> int | None:
    """The first row when ``rows`` are consecutive (one side of the batch is one slice)."""
    if not len(rows):
        return None
    first = int(rows[0])
    if len(rows) == 1 or bool((np.diff(rows) == 1).all()):
        return first
    return None
