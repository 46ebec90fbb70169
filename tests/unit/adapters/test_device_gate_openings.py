"""A layerwise READ whose reads are same-host device copies: the device opens each layer's
gate itself, right after that layer's copies (no host polling in between), and never before
the closing it answers ran; a layer any of whose reads went another way waits for the host.

The device is a :class:`~moriio.testing.fake_stream.FakeStream` with three streams: the
forward's (0), the copier's (1) and the gate stream (2).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest

from moriio.testing.fake_stream import BASE_ADDRESS, FakeCopyStream, FakeStream

pytest.importorskip("torch")

import torch

from moriio.adapters.device.copier import DeviceCopier
from moriio.adapters.device.envelope import ProcessIdentity
from moriio.adapters.device.same_host import SameHostDeviceEngine
from moriio.adapters.device.stream_gates import StreamGates
from moriio.domain.worker.consumer.gate_book import GateBook, batch_tag
from moriio.domain.worker.poster import Poster, PostRequest
from moriio.ports import MemoryKind, TransferOp
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryTransferEngine

BLOCK = 1024
LAYERS = ("l0", "l1")
FORWARD, COPIER, GATES = 0, 1, 2


class SharedAddressMemory:
    def export(self, address: int) -> object:
        from moriio.adapters.device.peer_memory import Export

        return Export(address.to_bytes(8, "little") + bytes(56), 0)

    def open(self, handle: bytes) -> int:
        return int.from_bytes(handle[:8], "little")

    def close(self, handle: bytes) -> None:
        return None


class Rig:
    def __init__(self) -> None:
        self.device = FakeStream(len(LAYERS))
        fabric, memory = InMemoryFabric(), SharedAddressMemory()
        copier = DeviceCopier(
            torch.device("cpu"),
            stream=FakeCopyStream(self.device, COPIER),
            gate_stream=FakeCopyStream(self.device, GATES),
        )
        self.engine = SameHostDeviceEngine(
            InMemoryTransferEngine("d", fabric), memory, copier,
            identity=ProcessIdentity("host", "d", 1),
        )  # fmt: skip
        producer = SameHostDeviceEngine(
            InMemoryTransferEngine("p", fabric), memory, DeviceCopier(torch.device("cpu")),
            identity=ProcessIdentity("host", "p", 2),
        )  # fmt: skip
        self.theirs = np.random.default_rng(1).integers(1, 256, 8 * BLOCK, dtype=np.uint8)
        self.mine = np.zeros_like(self.theirs)
        self.local = [
            self.engine.register_region(
                self.mine.ctypes.data + i * 4 * BLOCK, 4 * BLOCK, MemoryKind.DEVICE
            )
            for i in range(len(LAYERS))
        ]
        remote_regions = [
            producer.register_region(
                self.theirs.ctypes.data + i * 4 * BLOCK, 4 * BLOCK, MemoryKind.DEVICE
            )
            for i in range(len(LAYERS))
        ]
        peer = self.engine.add_peer(producer.metadata())
        self.remote = [self.engine.import_region(peer, r.descriptor) for r in remote_regions]
        self.gates = StreamGates(self.device, self.device.words, BASE_ADDRESS, lambda: FORWARD)
        self.gates.attach(self.engine)
        self.book = GateBook(self.gates, list(LAYERS))
        self.seen: list[bool] = []

    def post(self, layer: int, transfer: str, engine: object = None) -> None:
        offsets = np.array([BLOCK, 3 * BLOCK], dtype=np.int64)
        sizes = np.full(2, BLOCK, dtype=np.int64)
        (engine or self.engine).post(  # type: ignore[attr-defined]
            TransferOp.READ, self.local[layer], self.remote[layer], offsets, offsets, sizes,
            batch_tag(transfer, LAYERS[layer]),
        )  # fmt: skip

    def forward(self) -> None:
        for layer in range(len(LAYERS)):
            self.gates.enqueue_wait(layer)
            start = layer * 4 * BLOCK
            self.device.kernel(
                lambda s=start: self.seen.append(bool(self.mine[s + BLOCK : s + 2 * BLOCK].any()))
            )


def test_the_device_opens_each_gate_after_its_layer_s_copies_without_the_host() -> None:
    rig = Rig()
    for layer in range(len(LAYERS)):
        rig.post(layer, "t1")
    rig.book.arm(frozenset({"t1"}))
    rig.forward()
    assert rig.book.opened_by_device == len(LAYERS)
    assert rig.device.run(order=[FORWARD, GATES, COPIER])  # no host call in between
    assert rig.seen == [True, True]  # every layer read its landed KV


def test_the_device_never_opens_a_gate_before_the_closing_it_answers_ran() -> None:
    """The gate stream runs first and the copies are done, but closing 1 has not run on the
    forward's stream yet: opening now would be undone by it."""
    rig = Rig()
    rig.device.kernel(lambda: None, stream=FORWARD)  # an earlier forward, still running
    blocker = rig.device.words.copy()
    rig.post(0, "t1")
    rig.post(1, "t1")
    rig.book.arm(frozenset({"t1"}))
    rig.device.run(order=[COPIER, GATES])
    assert np.array_equal(rig.device.words, blocker)  # the gate stream waits for closing 1
    rig.forward()
    assert rig.device.run(order=[FORWARD, GATES, COPIER])
    assert rig.seen == [True, True]


def test_a_layer_read_another_way_waits_for_the_host() -> None:
    rig = Rig()
    rig.post(0, "t1")
    rig.post(1, "t2")  # t2's layer-1 read is a device copy, but t1's is missing
    rig.book.arm(frozenset({"t1", "t2"}))
    rig.forward()
    assert rig.book.opened_by_device == 0
    assert not rig.device.run()  # both layers wait: a read of each is not a copy here


def test_the_poster_tags_a_layer_s_batch_as_the_gate_book_expects() -> None:
    class Recording(InMemoryTransferEngine):
        tags: ClassVar[list[str]] = []

        def post(self, *args: object) -> object:
            self.tags.append(str(args[-1]))
            return super().post(*args)  # type: ignore[arg-type]

    from moriio.domain.kv.planner import TransferPlan
    from moriio.domain.timing.policy import TransferPolicy

    engine = Recording("x", InMemoryFabric())
    poster = Poster(engine, FakeClock(), TransferPolicy())
    plan = TransferPlan(np.zeros(1, np.int64), np.zeros(1, np.int64), np.full(1, 8, np.int64))
    buffer = np.zeros(64, np.uint8)
    local = engine.register_region(buffer.ctypes.data, 64)
    remote = engine.import_region(engine.add_peer(engine.metadata()), local.descriptor)
    poster.submit(PostRequest("t9", "layer.3", TransferOp.READ, local, remote, plan))
    assert engine.tags == [batch_tag("t9", "layer.3")]


def test_the_worker_s_wrapper_lets_its_engine_open_the_worker_s_gates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moriio.adapters.device import same_host as same_host_module

    monkeypatch.setattr(same_host_module, "DriverPeerMemory", lambda hip: SharedAddressMemory())
    device = FakeStream(1)
    gates = StreamGates(device, device.words, BASE_ADDRESS, lambda: FORWARD)
    wrap = same_host_module.same_host_wrapper(torch.device("cpu"), gates=gates)
    engine = wrap(InMemoryTransferEngine("w", InMemoryFabric()))
    assert gates._opener is engine
    unshared = StreamGates(device, device.words, BASE_ADDRESS, lambda: FORWARD)
    same_host_module.same_host_wrapper(torch.device("cpu"), share=False, gates=unshared)(
        InMemoryTransferEngine("v", InMemoryFabric())
    )
    assert unshared._opener is None
