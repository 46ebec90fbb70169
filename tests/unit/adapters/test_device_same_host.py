"""The same-host engine on host memory: it maps a same-host peer's regions and copies
between them itself, reaches other peers through the transport, tells processes apart by a
token (not their pid), reads the envelope of peers even when it shares nothing, never waits
on the device to unmap, fails a batch whose launch failed, and refuses a hostile envelope
or another device's pointer by name."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

import torch

from moriio.adapters.device import same_host as same_host_module
from moriio.adapters.device.copier import DeviceCopier
from moriio.adapters.device.envelope import MAGIC, ProcessIdentity, unwrap, wrap
from moriio.adapters.device.kernels import TorchRows
from moriio.adapters.device.peer_memory import Export, PeerMemoryError, byte_view
from moriio.adapters.device.same_host import SameHostDeviceEngine
from moriio.ports import MemoryKind, TransferEngineError, TransferOp, TransferState
from moriio.testing.fake_stream import FakeCopyStream, FakeStream
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine

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
    def __init__(
        self,
        *,
        consumer_host: str = "host-a",
        consumer_pid: int = 2,
        copier: DeviceCopier | None = None,
    ) -> None:
        fabric = InMemoryFabric()
        self.memory = SameProcessMemory()
        self.inner_p = InMemoryTransferEngine("p", fabric)
        self.inner_d = InMemoryTransferEngine("d", fabric)
        producer = ProcessIdentity("host-a", "token-p", 1)
        consumer = ProcessIdentity(consumer_host, "token-d", consumer_pid)
        self.p = SameHostDeviceEngine(
            self.inner_p, self.memory, DeviceCopier(CPU), identity=producer
        )
        self.d = SameHostDeviceEngine(
            self.inner_d, self.memory, copier or DeviceCopier(CPU), identity=consumer
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


def test_two_processes_with_one_pid_in_two_containers_still_map_each_other() -> None:
    """Containers of one host share its boot id, and their process ids repeat."""
    pair = Pair(consumer_pid=1)  # the producer's pid too
    src_off, dst_off, sizes = pair.read(14)
    assert np.array_equal(pair.d_kv, _expected(pair, src_off, dst_off, sizes))
    assert pair.d.mapped_batches == 1


def test_a_peer_that_shares_nothing_still_reads_the_envelope_of_one_that_does() -> None:
    """``same_host_copies`` off on one side: the handshake and the transfers still work."""
    fabric = InMemoryFabric()
    sharing = SameHostDeviceEngine(
        InMemoryTransferEngine("p", fabric), SameProcessMemory(), DeviceCopier(CPU)
    )
    inner_d = InMemoryTransferEngine("d", fabric)
    plain = SameHostDeviceEngine(inner_d, SameProcessMemory(), DeviceCopier(CPU), share=False)
    p_kv = np.random.default_rng(5).integers(0, 256, BLOCKS * BLOCK, dtype=np.uint8)
    d_kv = np.zeros_like(p_kv)
    p_region = sharing.register_region(p_kv.ctypes.data, p_kv.nbytes, MemoryKind.DEVICE)
    d_region = plain.register_region(d_kv.ctypes.data, d_kv.nbytes, MemoryKind.DEVICE)
    remote = plain.import_region(plain.add_peer(sharing.metadata()), p_region.descriptor)
    sharing.import_region(sharing.add_peer(plain.metadata()), d_region.descriptor)
    src_off, dst_off, sizes = _descriptors(15, 10)
    handle = plain.post(TransferOp.READ, d_region, remote, dst_off, src_off, sizes, "t")
    assert plain.poll(handle).state is TransferState.SUCCEEDED
    expected = np.zeros_like(d_kv)
    _per_descriptor(expected, p_kv, dst_off, src_off, sizes)
    assert np.array_equal(d_kv, expected)
    assert plain.mapped_batches == 0
    assert len(inner_d.posted) == 1


def test_removing_a_peer_never_waits_on_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """The peer is removed under the progress lock while a copy is still queued behind a
    forward that waits on a gate only that lock's holder opens: waiting for the device
    there hangs both. The mapping is closed once the queued copy ran instead."""

    def device_wide_wait(*_: object) -> None:
        raise AssertionError("a device-wide synchronize while removing a peer")

    monkeypatch.setattr(torch.cuda, "synchronize", device_wide_wait)
    monkeypatch.setattr(same_host_module, "byte_view", lambda a, n, _: byte_view(a, n, CPU))
    device = FakeStream(1)
    device.wait_any_bit(0, 0x10_0000, 1)  # the forward, waiting on a closed gate
    copier = DeviceCopier(
        torch.device("cuda", 0), kernel=TorchRows(), stream=FakeCopyStream(device, 1)
    )
    pair = Pair(copier=copier)
    src_off, dst_off, sizes = _descriptors(16, 8)
    handle = pair.d.post(TransferOp.READ, pair.d_region, pair.remote, dst_off, src_off, sizes, "t")
    pair.d.remove_peer(pair.remote.peer)
    assert pair.memory.closed == []  # the queued copy may still read the mapping
    assert not pair.d.settled(handle)
    device.words[0] = 1  # the gate opens: the forward, then the copy, run
    assert device.run()
    pair.d.progress()
    assert pair.memory.closed == [pair.p_kv.ctypes.data]
    assert pair.d.poll(handle).state is TransferState.SUCCEEDED


def test_a_copy_whose_launch_fails_is_a_failed_settled_batch() -> None:
    class Broken(TorchRows):
        def launch(self, dst: torch.Tensor, src: torch.Tensor, rows: object) -> int:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    pair = Pair(copier=DeviceCopier(CPU, kernel=Broken()))
    src_off, dst_off, sizes = _descriptors(17, 20)
    handle = pair.d.post(TransferOp.READ, pair.d_region, pair.remote, dst_off, src_off, sizes, "t")
    status = pair.d.poll(handle)
    assert status.state is TransferState.FAILED
    assert "illegal memory access" in status.message
    assert pair.d.settled(handle)


def test_a_pointer_of_another_device_is_refused_not_copied(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch places a peer pointer on the device the driver names, and copies it to the one
    asked for: the view would then be a private copy (stale reads, lost writes)."""
    elsewhere = torch.zeros(16, dtype=torch.uint8)

    def as_tensor(data: object, device: object = None) -> torch.Tensor:
        return elsewhere if device is None else elsewhere.clone()

    monkeypatch.setattr(torch, "as_tensor", as_tensor)
    with pytest.raises(PeerMemoryError, match="belongs to cpu, not cuda:1"):
        byte_view(0x7000_0000, 16, torch.device("cuda", 1))


def test_a_peer_region_torch_will_not_view_in_place_goes_through_the_transport(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def view_local_only(address: int, length: int, device: torch.device) -> torch.Tensor:
        calls.append(address)
        if len(calls) > 2:  # both engines' own regions are viewed; the peer's is refused
            raise PeerMemoryError(f"memory at {address:#x} belongs to cuda:1, not {device}")
        return byte_view(address, length, device)

    monkeypatch.setattr(same_host_module, "byte_view", view_local_only)
    pair = Pair()
    src_off, dst_off, sizes = pair.read(18)
    assert np.array_equal(pair.d_kv, _expected(pair, src_off, dst_off, sizes))
    assert len(calls) == 3
    assert len(pair.inner_d.posted) == 1
    assert pair.d.mapped_batches == 0
    assert pair.memory.closed == [pair.p_kv.ctypes.data]  # the refused mapping is undone


def test_close_waits_a_bounded_time_then_leaves_a_busy_mapping_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(same_host_module, "byte_view", lambda a, n, _: byte_view(a, n, CPU))
    device = FakeStream(1)
    device.wait_any_bit(1, 0x10_0000, 1)  # the copier's stream never gets past this
    stream = FakeCopyStream(device, 1)
    pair = Pair(copier=DeviceCopier(torch.device("cuda", 0), kernel=TorchRows(), stream=stream))
    pair.d._unmap_wait = 0.01
    src_off, dst_off, sizes = _descriptors(19, 4)
    pair.d.post(TransferOp.READ, pair.d_region, pair.remote, dst_off, src_off, sizes, "t")
    pair.d.close()
    assert pair.memory.closed == []  # a copy may still use it: never unmapped under it
