"""One batch of scattered block copies between two mapped memories, as a few device kernels.

The descriptors of a batch (offsets and sizes in bytes) are cut into units of their greatest
common divisor (a KV block's bytes in one layer, or a multiple of it), and the units move as
rows with one gather and one scatter per chunk of at most :data:`STAGING_BYTES` (the
gather's temporary), instead of one descriptor each. A batch of few descriptors is copied
descriptor by descriptor (a plain device memcpy each). Completion is an event on the
copier's own stream: nothing waits on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

STAGING_BYTES = 64 << 20  # the most a batch's gather holds at once, per copier
MIN_UNIT_BYTES = 256  # finer descriptors are copied one by one
MEMCPY_DESCRIPTORS = 8  # at most this many: one memcpy each

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


class DeviceCopier:
    """Copies on its own stream of ``device`` (host memory: in the calling thread)."""

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
        self.batches = 0
        self.kernels = 0

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
            self._run(dst, src, dst_offsets, src_offsets, sizes)
            return Done()
        with torch.cuda.stream(self._stream):
            self._run(dst, src, dst_offsets, src_offsets, sizes)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self._stream)
        return done

    def _run(
        self, dst: torch.Tensor, src: torch.Tensor, dst_off: Int64s, src_off: Int64s, sizes: Int64s
    ) -> None:
        src_off, dst_off, sizes = coalesced(src_off, dst_off, sizes)
        few = len(sizes) <= self.memcpy_descriptors
        plan = None if few else unit_plan(src_off, dst_off, sizes)
        if plan is None:
            for d, s, n in zip(dst_off.tolist(), src_off.tolist(), sizes.tolist(), strict=True):
                dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
                self.kernels += 1
            return
        unit = plan.unit
        dst_rows = dst[: len(dst) // unit * unit].view(-1, unit)
        src_rows = src[: len(src) // unit * unit].view(-1, unit)
        step = max(1, self.staging_bytes // unit)
        src_index = torch.from_numpy(plan.src).to(self.device, non_blocking=True)
        dst_index = torch.from_numpy(plan.dst).to(self.device, non_blocking=True)
        for start in range(0, len(plan.src), step):
            rows = src_rows.index_select(0, src_index[start : start + step])
            dst_rows.index_copy_(0, dst_index[start : start + step], rows)
            self.kernels += 2
