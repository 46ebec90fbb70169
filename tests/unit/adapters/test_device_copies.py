"""Device copies on host memory: rows, kernels and the copier are byte-exact against one copy
per descriptor (torch's kernels here; Triton's too where it imports, on a GPU or its
interpreter); a batch is one launch where one side is a slice, rows move as wide elements;
a copy is ordered after the forward thread's stream; a failed launch is a failed batch."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch

from moriio.adapters.device.copier import DeviceCopier
from moriio.adapters.device.kernels import (
    TorchRows,
    TritonRows,
    copy_segments,
    row_view,
    triton_available,
)
from moriio.adapters.device.rows import element_width, unit_plan
from moriio.testing.fake_stream import FakeCopyStream, FakeStream

BLOCK = 1024
BLOCKS = 64
CPU = torch.device("cpu")


def _descriptors(seed: int, count: int, run: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.permutation(BLOCKS // run)[:count].astype(np.int64) * run * BLOCK
    dst = rng.permutation(BLOCKS // run)[:count].astype(np.int64) * run * BLOCK
    return src, dst, np.full(count, run * BLOCK, dtype=np.int64)


def _per_descriptor(dst: np.ndarray, src: np.ndarray, d_off, s_off, sizes) -> None:  # type: ignore[no-untyped-def]
    for d, s, n in zip(d_off, s_off, sizes, strict=True):
        dst[d : d + n] = src[s : s + n]


def _source(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    count=st.integers(1, 32),
    run=st.sampled_from([1, 2, 4]),
    staging_blocks=st.integers(1, 9),
)
def test_the_copier_is_byte_exact_against_one_copy_per_descriptor(
    seed: int, count: int, run: int, staging_blocks: int
) -> None:
    count = min(count, BLOCKS // run)
    src_off, dst_off, sizes = _descriptors(seed, count, run)
    source = _source(seed)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    got = np.zeros_like(source)
    copier = DeviceCopier(CPU, kernel=TorchRows(staging_bytes=staging_blocks * BLOCK))
    done = copier.copy(torch.from_numpy(got), torch.from_numpy(source), dst_off, src_off, sizes)
    assert done.query()
    assert not done.error
    assert np.array_equal(got, expected)


def test_scattered_rows_take_two_kernels_per_staging_chunk_not_one_per_block() -> None:
    src_off, dst_off, sizes = _descriptors(3, 48)
    copier = DeviceCopier(CPU, kernel=TorchRows(staging_bytes=16 * BLOCK))
    dst = torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8)
    copier.copy(dst, torch.from_numpy(_source(3)), dst_off, src_off, sizes)
    assert copier.kernels == 2 * 3  # 48 blocks in chunks of 16


@pytest.mark.parametrize("side", ["source", "destination"])
def test_a_side_whose_rows_are_one_slice_takes_one_kernel_and_no_temporary(side: str) -> None:
    """A whole request whose local blocks are consecutive: one launch, whatever its size."""
    scattered = np.random.default_rng(4).permutation(BLOCKS).astype(np.int64)[:40] * BLOCK
    consecutive = (np.arange(40, dtype=np.int64) + 7) * BLOCK
    src_off, dst_off = (consecutive, scattered) if side == "source" else (scattered, consecutive)
    sizes = np.full(40, BLOCK, dtype=np.int64)
    source = _source(4)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    got = np.zeros_like(source)
    copier = DeviceCopier(CPU, kernel=TorchRows(staging_bytes=BLOCK))  # a tiny staging bound
    copier.copy(torch.from_numpy(got), torch.from_numpy(source), dst_off, src_off, sizes)
    assert copier.kernels == 1
    assert np.array_equal(got, expected)


def test_descriptors_contiguous_on_both_sides_are_one_memcpy() -> None:
    offsets = np.arange(32, dtype=np.int64) * BLOCK
    copier = DeviceCopier(CPU)
    source = _source(1)
    got = np.zeros_like(source)
    sizes = np.full(32, BLOCK, dtype=np.int64)
    copier.copy(
        torch.from_numpy(got), torch.from_numpy(source), offsets + 16 * BLOCK, offsets, sizes
    )
    assert copier.kernels == 1
    assert np.array_equal(got[16 * BLOCK : 48 * BLOCK], source[: 32 * BLOCK])


def test_a_granularity_finer_than_the_unit_floor_is_copied_per_descriptor() -> None:
    assert unit_plan(np.array([0, 40]), np.array([0, 120]), np.array([40, 40])) is None
    plan = unit_plan(np.array([0, 4096]), np.array([2048, 0]), np.array([2048, 4096]))
    assert plan is not None
    assert plan.unit == 2048
    assert plan.src.tolist() == [0, 2, 3]
    assert plan.dst.tolist() == [1, 0, 1]
    padded = unit_plan(np.array([0, 10240]), np.array([10240, 0]), np.array([9344, 9344]))
    assert padded is not None  # blocks padded to 1 KiB strides: 128-byte rows
    assert padded.unit == 128
    assert plan.src.dtype == np.int32  # row numbers as int32 while they fit


def test_rows_move_as_the_widest_aligned_element_and_stay_exact_unaligned() -> None:
    assert element_width(16384, 0x1000, 0x2000) == 8
    assert element_width(16384, 0x1004, 0x2000) == 4
    assert element_width(16386, 0x1000, 0x2000) == 2
    assert row_view(torch.zeros(4 * BLOCK, dtype=torch.uint8), BLOCK, 8).dtype == torch.int64
    src_off, dst_off, sizes = _descriptors(6, 30)
    source = _source(6)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    shifted = torch.zeros(BLOCKS * BLOCK + 2, dtype=torch.uint8)[2:]  # 2-byte aligned only
    DeviceCopier(CPU).copy(shifted, torch.from_numpy(source), dst_off, src_off, sizes)
    assert np.array_equal(shifted.numpy(), expected)


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for array in arrays:
        array.flags.writeable = False
    return arrays


def test_a_frozen_plan_posted_again_is_prepared_once_and_still_byte_exact() -> None:
    """Every layer of one geometry posts the planner's same (read-only) plan."""
    src_off, dst_off, sizes = _frozen(*_descriptors(21, 40))
    copier = DeviceCopier(CPU)
    source = _source(2)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    for _ in range(3):
        got = np.zeros_like(source)
        copier.copy(torch.from_numpy(got), torch.from_numpy(source), dst_off, src_off, sizes)
        assert np.array_equal(got, expected)
    assert copier.prepared_hits == 2


def test_writable_offsets_are_never_reused_from_an_earlier_post() -> None:
    src_off, dst_off, sizes = _descriptors(22, 40)
    copier = DeviceCopier(CPU)
    source = _source(3)
    copier.copy(
        torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8),
        torch.from_numpy(source),
        dst_off,
        src_off,
        sizes,
    )
    dst_off[:] = dst_off[::-1].copy()  # the caller changed its batch in place
    got = np.zeros_like(source)
    copier.copy(torch.from_numpy(got), torch.from_numpy(source), dst_off, src_off, sizes)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    assert np.array_equal(got, expected)
    assert copier.prepared_hits == 0


def test_copy_segments_moves_mixed_sizes_like_one_copy_per_segment() -> None:
    """The plain entry point (e.g. for a staging region): K and V halves of unequal blocks."""
    src_off = np.array([0, 8 * BLOCK, 3 * BLOCK, 40 * BLOCK], dtype=np.int64)
    dst_off = np.array([20 * BLOCK, 0, 50 * BLOCK, 4 * BLOCK], dtype=np.int64)
    sizes = np.array([2 * BLOCK, BLOCK, 3 * BLOCK, BLOCK // 2], dtype=np.int64)
    source = _source(8)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    got = np.zeros_like(source)
    assert copy_segments(torch.from_numpy(got), torch.from_numpy(source), dst_off, src_off, sizes)
    assert np.array_equal(got, expected)


def test_the_copy_waits_for_work_the_forward_thread_queued_before_it() -> None:
    """A forward queued before the post still reads a block the copy overwrites."""
    device = FakeStream(1)
    forward, copies = 0, 1
    copier = DeviceCopier(CPU, stream=FakeCopyStream(device, copies, caller=forward))
    kv = torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8)
    seen: list[int] = []
    device.kernel(lambda: seen.append(int(kv[5 * BLOCK])), stream=forward)  # reads block 5
    source = torch.full((BLOCKS * BLOCK,), 7, dtype=torch.uint8)
    offsets = np.array([5 * BLOCK], dtype=np.int64)
    done = copier.copy(kv, source, offsets, offsets, np.array([BLOCK], dtype=np.int64))
    assert device.run(order=[copies, forward])  # the device gets to the copier first
    assert seen == [0]  # the forward read the block before the copy landed
    assert done.query()
    assert int(kv[5 * BLOCK]) == 7


def test_a_copy_posted_from_another_thread_is_not_ordered_after_the_forward() -> None:
    device = FakeStream(1)
    copier = DeviceCopier(CPU, stream=FakeCopyStream(device, 1, caller=0))
    device.kernel(lambda: None, stream=0)
    offsets = np.array([0], dtype=np.int64)
    kv = torch.zeros(BLOCK, dtype=torch.uint8)
    worker = threading.Thread(
        target=copier.copy, args=(kv, kv.clone(), offsets, offsets, np.array([BLOCK]))
    )
    worker.start()
    worker.join()
    device.run(order=[1])
    assert device.ran_all(1)
    assert not device.ran_all(0)


def test_a_launch_that_fails_is_a_failed_batch_not_an_exception() -> None:
    class OutOfMemory(TorchRows):
        def launch(self, dst: torch.Tensor, src: torch.Tensor, rows: object) -> int:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 MiB")

    copier = DeviceCopier(CPU, kernel=OutOfMemory())
    src_off, dst_off, sizes = _descriptors(9, 20)
    kv = torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8)
    done = copier.copy(kv, kv.clone(), dst_off, src_off, sizes)
    assert done.query()
    assert "out of memory" in done.error
    assert copier.failures == 1


_TRITON_DEVICE = (
    "cuda"
    if triton_available() and torch.cuda.is_available()
    else "cpu"
    if triton_available() and os.environ.get("TRITON_INTERPRET") == "1"
    else None
)


@pytest.mark.skipif(
    _TRITON_DEVICE is None,
    reason="Triton's kernel needs Triton and a GPU (or TRITON_INTERPRET=1 with Triton)",
)
@pytest.mark.parametrize(("unit", "shift"), [(BLOCK, 0), (BLOCK + 4, 4), (512 + 2, 2)])
def test_the_triton_kernel_is_byte_exact_in_one_launch(unit: int, shift: int) -> None:
    device = torch.device(_TRITON_DEVICE or "cpu")
    rows = 48
    rng = np.random.default_rng(unit)
    src_rows = rng.permutation(BLOCKS)[:rows].astype(np.int64)
    dst_rows = rng.permutation(BLOCKS)[:rows].astype(np.int64)
    sizes = np.full(rows, unit, dtype=np.int64)
    source = np.random.default_rng(1).integers(0, 256, BLOCKS * unit + shift, dtype=np.uint8)
    expected = np.zeros_like(source)
    _per_descriptor(expected[shift:], source[shift:], dst_rows * unit, src_rows * unit, sizes)
    src = torch.from_numpy(source).to(device)[shift:]
    dst = torch.zeros(BLOCKS * unit + shift, dtype=torch.uint8, device=device)[shift:]
    copier = DeviceCopier(device, kernel=TritonRows(), memcpy_descriptors=0)
    done = copier.copy(dst, src, dst_rows * unit, src_rows * unit, sizes)
    if device.type != "cpu":
        torch.cuda.synchronize(device)
    assert done.query()
    assert copier.kernels == 1
    assert np.array_equal(dst.cpu().numpy(), expected[shift:])
