"""One batch of scattered block copies between two mapped memories, as a few device kernels.

The descriptors of a batch (offsets and sizes in bytes) are cut into units of their greatest
common divisor (a KV block's bytes in one layer, or a multiple of it), and the units move as
rows with one gather and one scatter per chunk of at most :data:`STAGING_BYTES` (the
gather's temporary), instead of one descriptor each. A batch of few descriptors is copied
descriptor by descriptor (a plain device memcpy each). Completion is an event on the
copier's own stream: nothing waits on the host.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

STAGING_BYTES = 64 << 20  # the most a batch's gather holds at once, per copier
MIN_UNIT_BYTES = 256  # finer descriptors are copied one by one
MEMCPY_DESCRIPTORS = 8  # at most this many: one memcpy each
PREPARED_BATCHES = 64  # read-only batches whose rows and device indices are kept

Int64s = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class UnitPlan:
    """A batch as rows of ``unit`` bytes: row ``src[i]`` goes to row ``dst[i]``."""

    unit: int
    src: Int64s
    dst: Int64s


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
        return UnitPlan(unit, src_offsets // unit, dst_offsets // unit)
    total = int(counts.sum())
    starts = np.repeat(np.cumsum(counts) - counts, counts)
    within = np.arange(total, dtype=np.int64) - starts
    src = np.repeat(src_offsets // unit, counts) + within
    dst = np.repeat(dst_offsets // unit, counts) + within
    return UnitPlan(unit, src, dst)


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


class _Cuda:
    """``__cuda_array_interface__`` of raw device bytes, for ``torch.as_tensor``."""

    def __init__(self, address: int, length: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (length,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
        }


def byte_view(address: int, length: int, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over ``length`` bytes at ``address`` (no copy)."""
    if device.type == "cpu":
        array = np.ctypeslib.as_array((ctypes_bytes(length)).from_address(address))
        return torch.from_numpy(array)
    return torch.as_tensor(_Cuda(address, length), device=device)


def ctypes_bytes(length: int) -> Any:
    import ctypes

    return ctypes.c_uint8 * length


class Done:
    """A batch already complete (host memory: the copy ran in the call)."""

    def query(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A batch ready to launch: memcpy descriptors, or rows with their device indices."""

    memcpy: list[tuple[int, int, int]]  # (dst, src, bytes)
    unit: int = 0
    src_index: torch.Tensor | None = None
    dst_index: torch.Tensor | None = None


class DeviceCopier:
    """Copies on its own stream of ``device`` (host memory: in the calling thread).

    A batch whose offset arrays are read-only (the planner's plans are frozen, and every
    layer of one geometry posts the same plan) is prepared once: its rows and device
    indices are kept for the next post of the same arrays (:data:`PREPARED_BATCHES` kept).
    """

    def __init__(
        self,
        device: torch.device,
        staging_bytes: int = STAGING_BYTES,
        memcpy_descriptors: int = MEMCPY_DESCRIPTORS,
    ) -> None:
        self.device = device
        self.staging_bytes = staging_bytes
        self.memcpy_descriptors = memcpy_descriptors
        on_device = device.type != "cpu"
        self._stream = torch.cuda.Stream(device) if on_device else None  # type: ignore[no-untyped-call]
        self._prepared: OrderedDict[tuple[int, ...], tuple[tuple[Any, ...], _Prepared]] = (
            OrderedDict()
        )
        self.batches = 0
        self.kernels = 0
        self.prepared_hits = 0

    def copy(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        dst_offsets: Int64s,
        src_offsets: Int64s,
        sizes: Int64s,
    ) -> Any:
        """Queue the batch; returns what completes with it (``query()`` is True once done)."""
        self.batches += 1
        if self._stream is None:
            self._launch(dst, src, self._prepare(dst_offsets, src_offsets, sizes))
            return Done()
        with torch.cuda.stream(self._stream):
            self._launch(dst, src, self._prepare(dst_offsets, src_offsets, sizes))
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self._stream)
        return done

    def _prepare(self, dst_off: Int64s, src_off: Int64s, sizes: Int64s) -> _Prepared:
        arrays = (dst_off, src_off, sizes)
        frozen = not any(a.flags.writeable for a in arrays)
        key = tuple(id(a) for a in arrays)
        if frozen:
            cached = self._prepared.get(key)
            if cached is not None and all(r() is a for r, a in zip(cached[0], arrays, strict=True)):
                self._prepared.move_to_end(key)
                self.prepared_hits += 1
                return cached[1]
        prepared = self._plan(dst_off, src_off, sizes)
        if frozen:
            self._prepared[key] = (tuple(weakref.ref(a) for a in arrays), prepared)
            if len(self._prepared) > PREPARED_BATCHES:
                self._prepared.popitem(last=False)
        return prepared

    def _plan(self, dst_off: Int64s, src_off: Int64s, sizes: Int64s) -> _Prepared:
        src_off, dst_off, sizes = coalesced(src_off, dst_off, sizes)
        few = len(sizes) <= self.memcpy_descriptors
        plan = None if few else unit_plan(src_off, dst_off, sizes)
        if plan is None:
            triples = zip(dst_off.tolist(), src_off.tolist(), sizes.tolist(), strict=True)
            return _Prepared(list(triples))
        src_index = torch.from_numpy(plan.src).to(self.device, non_blocking=True)
        dst_index = torch.from_numpy(plan.dst).to(self.device, non_blocking=True)
        return _Prepared([], plan.unit, src_index, dst_index)

    def _launch(self, dst: torch.Tensor, src: torch.Tensor, prepared: _Prepared) -> None:
        for d, s, n in prepared.memcpy:
            dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
            self.kernels += 1
        if prepared.src_index is None or prepared.dst_index is None:
            return
        unit = prepared.unit
        dst_rows = dst[: len(dst) // unit * unit].view(-1, unit)
        src_rows = src[: len(src) // unit * unit].view(-1, unit)
        step = max(1, self.staging_bytes // unit)
        for start in range(0, len(prepared.src_index), step):
            rows = src_rows.index_select(0, prepared.src_index[start : start + step])
            dst_rows.index_copy_(0, prepared.dst_index[start : start + step], rows)
            self.kernels += 2
