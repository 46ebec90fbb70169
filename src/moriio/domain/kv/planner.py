"""Transfer planner: block-id pairs -> coalesced byte descriptors for one layer.

:func:`plan_transfer` is vectorised with numpy (no per-block Python loop). Descriptors follow
the order of the block ids; a run of pairs whose ids step by +1 (or by -1) on both sides at
once becomes one descriptor when the blocks' bytes are contiguous, which covers the orders
vLLM typically hands blocks out in (ascending, or descending after reversed frees) without
sorting. Layouts with two chunks per block list all K descriptors, then all V descriptors,
unless K and V of an interleaved block are adjacent (then they move as one piece).

:func:`plan_transfer_naive` is the per-block pure-Python reference (sort by local offset,
merge neighbours contiguous on both sides). It covers exactly the same byte pairs; the
descriptor order and count can differ where chunks of different blocks or of different K/V
halves happen to touch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from moriio.domain.kv.block_groups import MISSING_BLOCK
from moriio.domain.kv.layout import LayerGeometry, LayoutKind

Int64Array: TypeAlias = npt.NDArray[np.int64]
BlockIds: TypeAlias = Sequence[int] | npt.NDArray[np.integer]


@dataclass(frozen=True, slots=True, eq=False)
class TransferPlan:
    """Byte descriptors for one layer: ``sizes[i]`` bytes from ``local_offsets[i]`` of the
    local registered tensor to/from ``remote_offsets[i]`` of the peer's. Arrays are read-only
    int64; plans compare by identity (use :meth:`to_lists` to compare contents).
    """

    local_offsets: Int64Array
    remote_offsets: Int64Array
    sizes: Int64Array

    def __post_init__(self) -> None:
        n = self.sizes.shape
        if self.local_offsets.shape != n or self.remote_offsets.shape != n or len(n) != 1:
            raise ValueError("plan arrays must be 1-D and of equal length")
        for array in (self.local_offsets, self.remote_offsets, self.sizes):
            if array.dtype != np.int64:
                raise ValueError(f"plan arrays must be int64, got {array.dtype}")
            array.flags.writeable = False

    @property
    def num_descriptors(self) -> int:
        return int(self.sizes.shape[0])

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())

    def to_lists(self) -> tuple[list[int], list[int], list[int]]:
        """``(local_offsets, remote_offsets, sizes)`` as Python lists."""
        return self.local_offsets.tolist(), self.remote_offsets.tolist(), self.sizes.tolist()


def _empty() -> Int64Array:
    return np.zeros(0, dtype=np.int64)


def as_block_ids(ids: BlockIds, side: str) -> Int64Array:
    """Block ids as a 1-D int64 array (Python int lists are converted in one pass)."""
    if isinstance(ids, np.ndarray):
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise ValueError(f"{side} block ids must be a 1-D integer array, got {ids.dtype}")
        return ids.astype(np.int64, copy=False)
    try:
        packed = struct.pack(f"{len(ids)}q", *ids)
    except (struct.error, TypeError) as exc:
        raise ValueError(f"{side} block ids must be ints: {exc}") from None
    return np.frombuffer(packed, dtype=np.int64)


def as_num_blocks(value: int, name: str) -> int:
    """A positive block count as a Python int (numpy ints accepted)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def _check_range(ids: Int64Array, num_blocks: int, side: str) -> None:
    if ids.size and int(ids.view(np.uint64).max()) >= num_blocks:
        bad = int(ids[(ids < 0) | (ids >= num_blocks)][0])
        if bad == MISSING_BLOCK:
            raise ValueError(
                f"the {side} side holds no block at a position the transfer needs (freed, "
                "or past the end of its block list)"
            )
        raise ValueError(f"{side} block id {bad} is outside [0, {num_blocks})")


def _run_starts(local: Int64Array, remote: Int64Array) -> Int64Array | None:
    """Where runs of ids stepping by +1 (or by -1) on both sides start; None if all single."""
    step = local[1:] - local[:-1]
    joined = step == remote[1:] - remote[:-1]
    joined &= np.abs(step) == 1
    if not joined.any():
        return None
    # A run never turns back: +1 followed by -1 (or the reverse) revisits a block.
    joined[1:] &= ~(joined[:-1] & (step[1:] == -step[:-1]))
    starts = np.flatnonzero(~joined)
    starts += 1
    return np.concatenate(([0], starts))


def _offsets(first: Int64Array, stride: int, v_offset: int | None) -> Int64Array:
    """``first * stride``, followed by the same shifted by ``v_offset`` when given."""
    m = first.size
    out = np.empty(m if v_offset is None else 2 * m, dtype=np.int64)
    np.multiply(first, stride, out=out[:m])
    if v_offset is not None:
        np.add(out[:m], v_offset, out=out[m:])
    return out


def plan_transfer(
    geometry: LayerGeometry,
    local_block_ids: BlockIds,
    remote_block_ids: BlockIds,
    remote_num_blocks: int,
    remote_block_stride: int | None = None,
) -> TransferPlan:
    """Plan the byte copies pairing ``local_block_ids[i]`` with ``remote_block_ids[i]``.

    ``remote_block_stride``: bytes between the peer's blocks (its own padding), when it
    differs from ours; chunks keep our ``block_len`` on both sides.

    A shorter local list transfers only the paired prefix; an empty one gives an empty plan
    (nothing to move, blocks only to free). ValueError on a longer local list or on any id
    outside ``[0, num_blocks)`` of its side.
    """
    remote_num_blocks = as_num_blocks(remote_num_blocks, "remote_num_blocks")
    local = as_block_ids(local_block_ids, "local")
    remote = as_block_ids(remote_block_ids, "remote")
    n = local.size
    if n > remote.size:
        raise ValueError(f"{n} local block ids but only {remote.size} remote block ids")
    _check_range(local, geometry.num_blocks, "local")
    _check_range(remote, remote_num_blocks, "remote")
    if n == 0:
        return TransferPlan(_empty(), _empty(), _empty())
    remote = remote[:n]
    stride = geometry.block_stride_bytes
    rstride = remote_block_stride or stride
    chunk = geometry.block_len
    v_local = geometry.v_offset_bytes
    separated = geometry.kind is LayoutKind.SEPARATED
    # One piece per block (per K/V half when separated) unless K and V of an interleaved
    # block are apart; pieces of consecutive blocks touch only when a piece fills the stride.
    interleaved = geometry.transfers_per_block == 2 and not separated
    split_kv = interleaved and v_local != chunk
    unit = 2 * chunk if interleaved and not split_kv else chunk
    halves = 2 if separated or split_kv else 1
    touching = unit == stride == rstride and not split_kv
    starts = _run_starts(local, remote) if touching and n > 1 else None
    if starts is None:
        sizes = np.full(halves * n, unit, dtype=np.int64)
    else:
        ends = np.concatenate((starts[1:], [n]))
        ends -= 1
        local = np.minimum(local[starts], local[ends])
        remote = np.minimum(remote[starts], remote[ends])
        counts = ends - starts
        counts += 1
        counts *= unit
        sizes = counts if halves == 1 else np.concatenate((counts, counts))
    v_remote = geometry.remote_v_offset(remote_num_blocks, rstride)
    return TransferPlan(
        _offsets(local, stride, v_local if halves == 2 else None),
        _offsets(remote, rstride, v_remote if halves == 2 else None),
        sizes,
    )


def plan_transfer_naive(
    geometry: LayerGeometry,
    local_block_ids: Sequence[int],
    remote_block_ids: Sequence[int],
    remote_num_blocks: int,
    remote_block_stride: int | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Per-block pure-Python reference of :func:`plan_transfer` (same byte pairs)."""
    if len(local_block_ids) > len(remote_block_ids):
        raise ValueError("more local block ids than remote block ids")
    for ids, limit, side in (
        (local_block_ids, geometry.num_blocks, "local"),
        (remote_block_ids, remote_num_blocks, "remote"),
    ):
        for block in ids:
            if not 0 <= block < limit:
                raise ValueError(f"{side} block id {block} is outside [0, {limit})")
    stride, chunk = geometry.block_stride_bytes, geometry.block_len
    rstride = remote_block_stride or stride
    v_local = geometry.v_offset_bytes
    v_remote = geometry.remote_v_offset(remote_num_blocks, rstride)
    pieces: list[tuple[int, int]] = []
    for lb, rb in zip(local_block_ids, remote_block_ids, strict=False):
        pieces.append((lb * stride, rb * rstride))
        if geometry.transfers_per_block == 2:
            pieces.append((v_local + lb * stride, v_remote + rb * rstride))
    pieces.sort(key=lambda piece: piece[0])
    local_out: list[int] = []
    remote_out: list[int] = []
    sizes: list[int] = []
    for lo, ro in pieces:
        if sizes and local_out[-1] + sizes[-1] == lo and remote_out[-1] + sizes[-1] == ro:
            sizes[-1] += chunk
        else:
            local_out.append(lo)
            remote_out.append(ro)
            sizes.append(chunk)
    return local_out, remote_out, sizes
