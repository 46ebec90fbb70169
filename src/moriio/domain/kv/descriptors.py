"""Batches of (local offset, remote offset, size) descriptors: ordering and merging.

Transports pay per descriptor (UCX per operation, RDMA per work request), so a batch is
sorted by remote offset and descriptors contiguous on both sides are merged before it is
posted. Both functions keep every byte pair: the merged batch moves exactly what the input
batch moved.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import numpy.typing as npt

Int64s: TypeAlias = npt.NDArray[np.int64]


def in_remote_order(local: Int64s, remote: Int64s, sizes: Int64s) -> tuple[Int64s, Int64s, Int64s]:
    """The batch sorted by remote offset (stable; unchanged when already in order).

    The remote side then moves in ascending address order, and pairs contiguous on both sides
    but posted apart (a block table in any order, the layers of one block row) become
    neighbours that :func:`coalesce` merges.
    """
    if sizes.size < 2 or not (remote[1:] < remote[:-1]).any():
        return local, remote, sizes
    order = np.argsort(remote, kind="stable")
    return local[order], remote[order], sizes[order]


def coalesce(local: Int64s, remote: Int64s, sizes: Int64s) -> tuple[Int64s, Int64s, Int64s]:
    """Merge runs of neighbouring descriptors contiguous on both sides."""
    if sizes.size < 2:
        return local, remote, sizes
    ends = sizes[:-1]
    joins = (local[:-1] + ends == local[1:]) & (remote[:-1] + ends == remote[1:])
    if not joins.any():
        return local, remote, sizes
    starts = np.flatnonzero(np.concatenate(([True], ~joins)))
    return local[starts], remote[starts], np.add.reduceat(sizes, starts).astype(np.int64)


def merged(local: Int64s, remote: Int64s, sizes: Int64s) -> tuple[Int64s, Int64s, Int64s]:
    """:func:`coalesce` of the batch in remote order: the fewest descriptors a transport
    that merges by remote offset (NIXL here, mori's batch) posts for it."""
    return coalesce(*in_remote_order(local, remote, sizes))
