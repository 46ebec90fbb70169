"""NIXL for real (two agents in this process, host memory): a request's every layer in one
batch against each side's whole buffer, and the same request through staging regions
(gather on the peer, one descriptor per fill, scatter here), each byte-equal to a naive
per-block copy.

The buffers hold three layers of ``[2, nb, block bytes]`` (K plane, V plane) one after
another, as vLLM's one KV buffer holds a group's layers; each layer and each whole buffer
(a span) are registered.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from moriio.adapters.host_copies import HostSegmentCopier
from moriio.domain.kv.layout import LayerSpec, describe_layout
from moriio.domain.kv.request_plan import Placement, RequestLayer, plan_request
from moriio.domain.kv.staging_plan import stage_plan
from moriio.ports import LocalRegion, RemoteRegion, TransferEngine, TransferOp, TransferState

pytest.importorskip("nixl_cu12", reason="NIXL is not installed")

pytestmark = pytest.mark.integration

LAYERS, BLOCK_BYTES = 3, 4096
OURS, THEIRS = 12, 20  # blocks per layer on each side
PAIRS = [(4, 17), (5, 18), (0, 3), (9, 11), (2, 0)]
STAGING = 3 * BLOCK_BYTES + 512  # fills end inside pieces


def _engine(name: str) -> TransferEngine:
    from moriio.adapters.nixl import NixlTransferEngine

    return NixlTransferEngine(f"{name}-{uuid.uuid4().hex[:6]}", loopback=True)


class Side:
    def __init__(self, engine: TransferEngine, num_blocks: int, seed: int) -> None:
        self.engine = engine
        self.num_blocks = num_blocks
        layer_bytes = 2 * num_blocks * BLOCK_BYTES
        rng = np.random.default_rng(seed)
        self.buffer = rng.integers(0, 256, LAYERS * layer_bytes, dtype=np.uint8)
        self.staging = np.zeros(STAGING, dtype=np.uint8)
        base = self.buffer.ctypes.data
        self.span = engine.register_region(base, self.buffer.nbytes)
        self.staged = engine.register_region(self.staging.ctypes.data, STAGING)
        spec = LayerSpec(block_size=1, num_kv_heads=1, head_size=BLOCK_BYTES)
        shape = (2, num_blocks, 1, 1, BLOCK_BYTES)
        strides = (num_blocks * BLOCK_BYTES, BLOCK_BYTES, BLOCK_BYTES, BLOCK_BYTES, 1)
        self.geometry = describe_layout(shape, strides, 1, spec)
        self.offsets = [i * layer_bytes for i in range(LAYERS)]

    def planes(self, buffer: np.ndarray) -> np.ndarray:
        return buffer.reshape(LAYERS, 2, self.num_blocks, BLOCK_BYTES)


@pytest.fixture
def sides() -> Iterator[tuple[Side, Side]]:
    ours, theirs = _engine("consumer"), _engine("producer")
    try:
        yield Side(ours, OURS, 1), Side(theirs, THEIRS, 2)
    finally:
        ours.close()
        theirs.close()


def _run(engine: TransferEngine, target: TransferEngine, *args: object) -> None:
    handle = engine.post(*args, "request")  # type: ignore[arg-type]
    while (status := engine.poll(handle)).state is TransferState.IN_PROGRESS:
        target.progress()
    engine.release(handle)
    assert status.state is TransferState.SUCCEEDED, status.message


def _request(ours: Side, theirs: Side) -> tuple[object, np.ndarray]:
    layers = [
        RequestLayer(
            f"layer{i}",
            ours.geometry,
            THEIRS,
            None,
            Placement(0, ours.offsets[i]),
            Placement(0, theirs.offsets[i]),
        )
        for i in range(LAYERS)
    ]
    (batch,) = plan_request(layers, [p[0] for p in PAIRS], [p[1] for p in PAIRS])
    expected = ours.planes(ours.buffer.copy())
    for lb, rb in PAIRS:  # the naive per-block copy, every layer, K and V
        expected[:, :, lb] = theirs.planes(theirs.buffer)[:, :, rb]
    return batch, expected.reshape(-1)


def _connect(ours: Side, theirs: Side) -> tuple[RemoteRegion, RemoteRegion]:
    peer = ours.engine.add_peer(theirs.engine.metadata())
    theirs.engine.add_peer(ours.engine.metadata())
    span = ours.engine.import_region(peer, theirs.span.descriptor)
    staged = ours.engine.import_region(peer, theirs.staged.descriptor)
    return span, staged


def test_a_request_batch_over_nixl_moves_what_a_per_block_copy_moves(
    sides: tuple[Side, Side],
) -> None:
    ours, theirs = sides
    span, _ = _connect(ours, theirs)
    batch, expected = _request(ours, theirs)
    plan = batch.plan  # type: ignore[attr-defined]
    assert plan.num_descriptors == LAYERS * 2 * 4  # runs 4-5, 0, 9, 2 in each K and V plane
    _run(
        ours.engine,
        theirs.engine,
        TransferOp.READ,
        ours.span,
        span,
        plan.local_offsets,
        plan.remote_offsets,
        plan.sizes,
    )
    assert np.array_equal(ours.buffer, expected)


def test_a_staged_read_over_nixl_moves_what_a_per_block_copy_moves(
    sides: tuple[Side, Side],
) -> None:
    ours, theirs = sides
    _, staged = _connect(ours, theirs)
    batch, expected = _request(ours, theirs)
    copier = HostSegmentCopier()
    fills = stage_plan(batch.plan, STAGING, read=True)  # type: ignore[attr-defined]
    total = LAYERS * 2 * len(PAIRS) * BLOCK_BYTES
    assert len(fills) == -(-total // STAGING)
    one = np.zeros(1, dtype=np.int64)
    for fill in fills:
        g, s = fill.gather, fill.scatter
        assert copier.copy(theirs.staged, theirs.span, g.dst, g.src, g.sizes).query()
        length = np.array([fill.length], dtype=np.int64)
        _run(ours.engine, theirs.engine, TransferOp.READ, ours.staged, staged, one, one, length)
        assert copier.copy(ours.span, ours.staged, s.dst, s.src, s.sizes).query()
    assert np.array_equal(ours.buffer, expected)


def test_host_copies_refuse_device_memory_and_segments_outside_a_region(
    sides: tuple[Side, Side],
) -> None:
    from moriio.ports import MemoryKind, TransferEngineError

    ours, _ = sides
    copier = HostSegmentCopier()
    device = LocalRegion(99, ours.staged.addr, STAGING, MemoryKind.DEVICE, 0, b"")
    offsets = np.zeros(1, dtype=np.int64)
    with pytest.raises(TransferEngineError, match="host memory only"):
        copier.copy(ours.span, device, offsets, offsets, np.ones(1, dtype=np.int64))
    too_long = np.array([STAGING + 1], dtype=np.int64)
    before = ours.buffer.copy()
    with pytest.raises(TransferEngineError, match="outside"):
        copier.copy(ours.span, ours.staged, offsets, offsets, too_long)
    assert np.array_equal(ours.buffer, before)


def test_regions_inside_one_allocation_share_one_nixl_registration() -> None:
    from moriio.ports import Allocation

    engine = _engine("regions")
    calls: list[str] = []
    agent = engine._agent  # type: ignore[attr-defined]
    register, deregister = agent.register_memory, agent.deregister_memory

    def counted_register(*args: object, **kwargs: object) -> object:
        calls.append("register")
        return register(*args, **kwargs)

    def counted_deregister(*args: object, **kwargs: object) -> object:
        calls.append("deregister")
        return deregister(*args, **kwargs)

    agent.register_memory, agent.deregister_memory = counted_register, counted_deregister
    buffer, alone = np.zeros(1 << 16, dtype=np.uint8), np.zeros(4096, dtype=np.uint8)
    whole = Allocation(buffer.ctypes.data, buffer.nbytes)
    try:
        layers = [
            engine.register_region(whole.addr + i * 4096, 4096, allocation=whole) for i in range(3)
        ]
        span = engine.register_region(whole.addr, whole.length, allocation=whole)
        single = engine.register_region(alone.ctypes.data, alone.nbytes)
        assert calls == ["register", "register"]  # the allocation once, the lone region
        for region in (*layers, single):
            engine.deregister_region(region)
        assert calls == ["register", "register", "deregister"]  # the span still uses it
        engine.deregister_region(span)
        assert calls[-1] == "deregister"
        assert len(calls) == 4
        again = engine.register_region(whole.addr, 4096, allocation=whole)
        assert calls[-1] == "register"
        engine.deregister_region(again)
    finally:
        engine.close()
