"""Same-host device copies on host memory: the unit plan and the copier are byte-exact
against one copy per descriptor, whatever the staging bound; the engine maps a same-host
peer's regions and copies between them itself, reaches other peers through the transport,
and refuses a hostile envelope by name."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

import torch

from moriio.ports import MemoryKind, TransferEngineError, TransferOp, TransferState
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine
from moriio.vllm_plugin.device_copies import DeviceCopier, byte_view, unit_plan
from moriio.vllm_plugin.peer_memory import Export
from moriio.vllm_plugin.same_host_engine import MAGIC, SameHostDeviceEngine, unwrap, wrap

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
    source = np.random.default_rng(seed).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
    expected = np.zeros_like(source)
    _per_descriptor(expected, source, dst_off, src_off, sizes)
    got = np.zeros_like(source)
    copier = DeviceCopier(CPU, staging_bytes=staging_blocks * BLOCK)
    done = copier.copy(torch.from_numpy(got), torch.from_numpy(source), dst_off, src_off, sizes)
    assert done.query()
    assert np.array_equal(got, expected)


def test_many_scattered_blocks_take_two_kernels_per_staging_chunk_not_one_per_block() -> None:
    src_off, dst_off, sizes = _descriptors(3, 48)
    copier = DeviceCopier(CPU, staging_bytes=16 * BLOCK)
    source = np.arange(BLOCKS * BLOCK, dtype=np.int64).astype(np.uint8)
    copier.copy(
        torch.zeros(BLOCKS * BLOCK, dtype=torch.uint8),
        torch.from_numpy(source),
        dst_off,
        src_off,
        sizes,
    )
    assert copier.kernels == 2 * 3  # 48 blocks in chunks of 16


def test_descriptors_contiguous_on_both_sides_are_one_memcpy() -> None:
    offsets = np.arange(32, dtype=np.int64) * BLOCK
    copier = DeviceCopier(CPU)
    source = np.random.default_rng(1).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
    got = np.zeros_like(source)
    sizes = np.full(32, BLOCK, dtype=np.int64)
    copier.copy(
        torch.from_numpy(got), torch.from_numpy(source), offsets + 16 * BLOCK, offsets, sizes
    )
    assert copier.kernels == 1
    assert np.array_equal(got[16 * BLOCK : 48 * BLOCK], source[: 32 * BLOCK])


def test_a_granularity_finer_than_the_unit_floor_is_copied_per_descriptor() -> None:
    assert unit_plan(np.array([0, 100]), np.array([0, 300]), np.array([100, 100])) is None
    plan = unit_plan(np.array([0, 4096]), np.array([2048, 0]), np.array([2048, 4096]))
    assert plan is not None
    assert plan.unit == 2048
    assert plan.src.tolist() == [0, 2, 3]
    assert plan.dst.tolist() == [1, 0, 1]


class SameProcessMemory:
    """PeerMemory for two engines of one process: a handle is the address itself."""

    def __init__(self) -> None:
        self.opened: list[int] = []
        self.closed: list[int] = []

    def export(self, address: int) -> Export:
        return Export(address.to_bytes(8, "little") + bytes(56), 0)

    def open(self, handle: bytes) -> int:
        address = int.from_bytes(handle[:8], "little")
        self.opened.append(address)
        return address

    def close(self, handle: bytes) -> None:
        self.closed.append(int.from_bytes(handle[:8], "little"))


class Pair:
    def __init__(self, *, consumer_host: str = "host-a") -> None:
        fabric = InMemoryFabric()
        self.memory = SameProcessMemory()
        self.inner_p = InMemoryTransferEngine("p", fabric)
        self.inner_d = InMemoryTransferEngine("d", fabric)
        self.p = SameHostDeviceEngine(
            self.inner_p, self.memory, DeviceCopier(CPU), host="host-a", pid=1
        )
        self.d = SameHostDeviceEngine(
            self.inner_d, self.memory, DeviceCopier(CPU), host=consumer_host, pid=2
        )
        self.p_kv = np.random.default_rng(5).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
        self.d_kv = np.zeros(BLOCKS * BLOCK, dtype=np.uint8)
        self.p_region = self.p.register_region(
            self.p_kv.ctypes.data, self.p_kv.nbytes, MemoryKind.DEVICE
        )
        self.d_region = self.d.register_region(
            self.d_kv.ctypes.data, self.d_kv.nbytes, MemoryKind.DEVICE
        )
        peer = self.d.add_peer(self.p.metadata())
        self.remote = self.d.import_region(peer, self.p_region.descriptor)

    def read(self, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src_off, dst_off, sizes = _descriptors(seed, 40)
        handle = self.d.post(
            TransferOp.READ, self.d_region, self.remote, dst_off, src_off, sizes, "t"
        )
        for _ in range(5):
            status = self.d.poll(handle)
            if status.state is TransferState.SUCCEEDED:
                break
        assert status.state is TransferState.SUCCEEDED
        self.d.release(handle)
        return src_off, dst_off, sizes


def _expected(
    pair: Pair, src_off: np.ndarray, dst_off: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    expected = np.zeros_like(pair.d_kv)
    _per_descriptor(expected, pair.p_kv, dst_off, src_off, sizes)
    return expected


def test_a_same_host_peer_is_read_with_device_copies_not_the_transport() -> None:
    pair = Pair()
    src_off, dst_off, sizes = pair.read(11)
    assert np.array_equal(pair.d_kv, _expected(pair, src_off, dst_off, sizes))
    assert pair.d.mapped_batches == 1
    assert pair.inner_d.posted == []
    assert pair.memory.opened == [pair.p_kv.ctypes.data]


def test_a_write_to_a_same_host_peer_lands_in_its_memory() -> None:
    pair = Pair()
    src_off, dst_off, sizes = _descriptors(12, 40)
    pair.d_kv[:] = np.random.default_rng(9).integers(0, 256, pair.d_kv.nbytes, dtype=np.uint8)
    before = pair.p_kv.copy()
    handle = pair.d.post(TransferOp.WRITE, pair.d_region, pair.remote, src_off, dst_off, sizes, "t")
    assert pair.d.poll(handle).state is TransferState.SUCCEEDED
    _per_descriptor(before, pair.d_kv, dst_off, src_off, sizes)
    assert np.array_equal(pair.p_kv, before)


def test_a_peer_on_another_host_is_reached_through_the_transport() -> None:
    pair = Pair(consumer_host="host-b")
    src_off, dst_off, sizes = pair.read(13)
    assert np.array_equal(pair.d_kv, _expected(pair, src_off, dst_off, sizes))
    assert pair.d.mapped_batches == 0
    assert len(pair.inner_d.posted) == 1


def test_removing_the_peer_unmaps_its_memory() -> None:
    pair = Pair()
    pair.d.remove_peer(pair.remote.peer)
    assert pair.memory.closed == [pair.p_kv.ctypes.data]


def test_a_descriptor_outside_the_mapped_region_is_refused_before_any_byte_moves() -> None:
    pair = Pair()
    with pytest.raises(TransferEngineError, match="outside"):
        pair.d.post(
            TransferOp.READ,
            pair.d_region,
            pair.remote,
            np.array([0]),
            np.array([pair.p_kv.nbytes]),
            np.array([BLOCK]),
            "t",
        )
    assert not pair.d_kv.any()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (MAGIC + b"\x01", "truncated"),
        (MAGIC + (10**6).to_bytes(4, "little"), "refused"),
        (MAGIC + (3).to_bytes(4, "little") + b"[1]", "not an object"),
        (MAGIC + (2).to_bytes(4, "little") + b"{x", "not JSON"),
    ],
)
def test_a_hostile_envelope_is_refused_by_name(data: bytes, reason: str) -> None:
    with pytest.raises(TransferEngineError, match=reason):
        unwrap(data)


def test_bytes_without_an_envelope_are_the_transport_s_alone() -> None:
    assert unwrap(b"nixl-metadata") == ({}, b"nixl-metadata")
    assert unwrap(wrap({"host": "h"}, b"x")) == ({"host": "h"}, b"x")


def test_a_byte_view_aliases_host_memory() -> None:
    buffer = np.zeros(16, dtype=np.uint8)
    view = byte_view(buffer.ctypes.data, 16, CPU)
    view[3] = 7
    assert buffer[3] == 7


def _frozen(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    for array in arrays:
        array.flags.writeable = False
    return arrays


def test_a_frozen_plan_posted_again_is_prepared_once_and_still_byte_exact() -> None:
    """Every layer of one geometry posts the planner's same (read-only) plan."""
    src_off, dst_off, sizes = _frozen(*_descriptors(21, 40))
    copier = DeviceCopier(CPU)
    source = np.random.default_rng(2).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
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
    source = np.random.default_rng(3).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
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
