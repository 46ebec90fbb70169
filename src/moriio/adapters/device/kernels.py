"""The kernels that move a batch's rows (:mod:`~moriio.adapters.device.rows`) between two
memories: each side a flat byte tensor over its whole registered range (a layer, or the
whole KV allocation every layer of a group views).

* :class:`TritonRows` (where Triton imports and the memory is a GPU's, CUDA or ROCm): one
  launch per batch, one program per row, the row read and written as wide elements (the
  compiler emits 16-byte accesses for aligned rows), no temporary. Indices are int32.
* :class:`TorchRows` (elsewhere, and on host memory): rows viewed as the widest aligned
  element. Where one side's rows are consecutive (one slice), one kernel and no temporary
  (``index_copy_`` from the slice, or ``index_select`` into it); otherwise a gather into a
  bounded temporary and a scatter, two kernels per ``staging_bytes``.

:func:`copy_segments` is the plain entry point: bytes at offsets of one tensor to offsets of
another, on the calling thread's current stream.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from moriio.adapters.device.rows import (
    Int64s,
    UnitPlan,
    coalesced,
    element_width,
    run_start,
    unit_plan,
)

ELEMENT_DTYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}
STAGING_BYTES = 64 << 20  # the most a gather's temporary holds at once (torch path)
TRITON_BLOCK = 1024  # elements a Triton program moves per step of its row


@dataclass(frozen=True, slots=True)
class DeviceRows:
    """A :class:`UnitPlan` with its indices on the device (uploaded once, reused while the
    plan is): ``src_run``/``dst_run`` the first row where that side's rows are consecutive."""

    unit: int
    rows: int
    src: torch.Tensor
    dst: torch.Tensor
    src_run: int | None
    dst_run: int | None

    @property
    def nbytes(self) -> int:
        return self.src.nbytes + self.dst.nbytes


class RowKernel(Protocol):
    """Moves every row of a prepared batch between two flat byte tensors."""

    name: str
    index_dtype: torch.dtype

    def launch(self, dst: torch.Tensor, src: torch.Tensor, rows: DeviceRows) -> int:
        """Queue the copy on the current stream; returns the kernels launched."""
        ...


def upload(plan: UnitPlan, device: torch.device, index_dtype: torch.dtype) -> DeviceRows:
    """The plan's indices on ``device`` as ``index_dtype`` (a host-to-device copy each)."""
    dtype = np.int64 if index_dtype == torch.int64 else plan.src.dtype
    src = torch.from_numpy(np.ascontiguousarray(plan.src, dtype=dtype))
    dst = torch.from_numpy(np.ascontiguousarray(plan.dst, dtype=dtype))
    if device.type != "cpu":
        src, dst = src.to(device, non_blocking=True), dst.to(device, non_blocking=True)
    return DeviceRows(plan.unit, plan.rows, src, dst, run_start(plan.src), run_start(plan.dst))


def row_view(buffer: torch.Tensor, unit: int, width: int) -> torch.Tensor:
    """``buffer`` (flat uint8) as rows of ``unit`` bytes, each ``unit // width`` elements."""
    count = buffer.numel() // unit
    flat = buffer[: count * unit].view(ELEMENT_DTYPES[width])
    return flat.view(count, unit // width)


class TorchRows:
    """Rows moved with torch's own indexing kernels (see the module docstring)."""

    name = "torch"
    index_dtype = torch.int64

    def __init__(self, staging_bytes: int = STAGING_BYTES) -> None:
        self.staging_bytes = staging_bytes

    def launch(self, dst: torch.Tensor, src: torch.Tensor, rows: DeviceRows) -> int:
        width = element_width(rows.unit, dst.data_ptr(), src.data_ptr())
        d, s = row_view(dst, rows.unit, width), row_view(src, rows.unit, width)
        if rows.src_run is not None:
            d.index_copy_(0, rows.dst, s[rows.src_run : rows.src_run + rows.rows])
            return 1
        if rows.dst_run is not None:
            torch.index_select(s, 0, rows.src, out=d[rows.dst_run : rows.dst_run + rows.rows])
            return 1
        step = max(1, self.staging_bytes // rows.unit)
        for start in range(0, rows.rows, step):
            chunk = slice(start, start + step)
            d.index_copy_(0, rows.dst[chunk], s.index_select(0, rows.src[chunk]))
        return 2 * -(-rows.rows // step)


def _triton_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[untyped-decorator]
    def copy_rows(dst, src, dst_rows, src_rows, row, BLOCK: tl.constexpr):  # type: ignore[no-untyped-def]  # noqa: N803
        pair = tl.program_id(0)
        to = tl.load(dst_rows + pair).to(tl.int64) * row
        start = tl.load(src_rows + pair).to(tl.int64) * row
        for first in range(0, row, BLOCK):
            within = first + tl.arange(0, BLOCK)
            mask = within < row
            values = tl.load(src + start + within, mask=mask)
            tl.store(dst + to + within, values, mask=mask)

    return copy_rows


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


class TritonRows:
    """One Triton launch per batch: program ``i`` copies row ``src[i]`` to row ``dst[i]``
    as elements of the widest aligned width, ``TRITON_BLOCK`` at a time."""

    name = "triton"
    index_dtype = torch.int32

    def __init__(self) -> None:
        self._kernel = _triton_kernel()

    def launch(self, dst: torch.Tensor, src: torch.Tensor, rows: DeviceRows) -> int:
        width = element_width(rows.unit, dst.data_ptr(), src.data_ptr())
        d, s = row_view(dst, rows.unit, width), row_view(src, rows.unit, width)
        if rows.rows:
            block = min(TRITON_BLOCK, 1 << (rows.unit // width - 1).bit_length())
            self._kernel[(rows.rows,)](d, s, rows.dst, rows.src, rows.unit // width, BLOCK=block)
        return 1


def row_kernel(device: torch.device) -> RowKernel:
    """Triton for a GPU's memory where it imports; torch's kernels otherwise."""
    if device.type == "cuda" and triton_available():
        try:
            return TritonRows()
        except (ImportError, RuntimeError):
            pass
    return TorchRows()


def copy_segments(
    dst: torch.Tensor,
    src: torch.Tensor,
    dst_offsets: Int64s,
    src_offsets: Int64s,
    sizes: Int64s,
    kernel: RowKernel | None = None,
) -> int:
    """Copy ``sizes[i]`` bytes from ``src[src_offsets[i]:]`` to ``dst[dst_offsets[i]:]``
    (flat uint8 tensors of one device) on the current stream; returns the kernels launched.

    Segments contiguous on both sides are merged first; equal rows then move in one launch
    (Triton) or a few (torch); a batch finer than 64-byte rows is copied segment by
    segment. Offsets are trusted: check them first (:func:`moriio.ports.batch.check_batch`).
    """
    src_offsets, dst_offsets, sizes = coalesced(src_offsets, dst_offsets, sizes)
    plan = unit_plan(src_offsets, dst_offsets, sizes)
    if plan is None:
        for d, s, n in zip(dst_offsets.tolist(), src_offsets.tolist(), sizes.tolist(), strict=True):
            dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
        return len(sizes)
    kernel = kernel or row_kernel(dst.device)
    return kernel.launch(dst, src, upload(plan, dst.device, kernel.index_dtype))
