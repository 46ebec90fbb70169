"""mori and vLLM's one shared KV buffer: each allocation registered once, layers as views.

vLLM views every layer's cache in one buffer (padded to 4 KiB on ROCm so MoRIIO can register
it whole). Layers are registered through :class:`LocalKV` with that storage named, as the
vLLM facade does; the stand-in mori records registrations, sessions and deregistrations.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from moriio.adapters.mori import MoriTransferEngine
from moriio.core import LayerSpec, plan_transfer
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV, RegisteredLayer
from moriio.ports import (
    Allocation,
    RemoteRegion,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
)
from support.mori_pair import WAIT, finish

BLOCK_SIZE, HEADS, HEAD_SIZE, NUM_BLOCKS = 4, 2, 8, 8
BLOCK_BYTES = BLOCK_SIZE * HEADS * HEAD_SIZE
LAYER_BYTES = 2 * NUM_BLOCKS * BLOCK_BYTES  # K and V planes
SLACK = 96  # the first layer does not start at the buffer's start (nor on a page)
SPEC = LayerSpec(block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE)
Bytes = npt.NDArray[np.uint8]


def _planes(buffer: Bytes, index: int) -> Bytes:
    """Shared layer ``index`` of ``buffer`` as (K/V plane, block, block bytes)."""
    start = SLACK + index * LAYER_BYTES
    return buffer[start : start + LAYER_BYTES].reshape(2, NUM_BLOCKS, BLOCK_BYTES)


def _layer_tensor(name: str, addr: int, storage: Allocation | None) -> LayerTensor:
    shape = (2, NUM_BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE)
    strides = (NUM_BLOCKS * BLOCK_BYTES, BLOCK_BYTES, HEADS * HEAD_SIZE, HEAD_SIZE, 1)
    return LayerTensor(name, addr, shape, strides, 1, "uint8", SPEC, storage=storage)


class Side:
    """One worker: ``shared`` layers in one padded buffer, plus ``alone`` standalone layers."""

    def __init__(self, name: str, seed: int, shared: int = 3, alone: int = 0) -> None:
        self.engine = MoriTransferEngine(name)
        rng = np.random.default_rng(seed)
        padded = -(-(SLACK + shared * LAYER_BYTES) // 4096) * 4096
        self.buffer: Bytes = rng.integers(0, 256, padded, dtype=np.uint8)
        self.singles: list[Bytes] = [
            rng.integers(0, 256, LAYER_BYTES, dtype=np.uint8) for _ in range(alone)
        ]
        storage = Allocation(self.buffer.ctypes.data, self.buffer.nbytes)
        tensors = [
            _layer_tensor(f"layer{i}", storage.addr + SLACK + i * LAYER_BYTES, storage)
            for i in range(shared)
        ]
        tensors += [
            _layer_tensor(f"layer{shared + i}", single.ctypes.data, None)
            for i, single in enumerate(self.singles)
        ]
        self.kv = LocalKV.register(self.engine, tensors)

    def layer_bytes(self, index: int) -> Bytes:
        """Layer ``index`` as (K/V plane, block, block bytes)."""
        shared = len(self.kv) - len(self.singles)
        if index >= shared:
            return self.singles[index - shared].reshape(2, NUM_BLOCKS, BLOCK_BYTES)
        return _planes(self.buffer, index)


class Link:
    """``a`` reads from ``b``: every layer of ``b`` imported on ``a``, as a handshake does."""

    def __init__(self, a: Side, b: Side) -> None:
        self.a, self.b = a, b
        b.engine.add_peer(a.engine.metadata())
        peer = a.engine.add_peer(b.engine.metadata())
        self.remote: dict[str, RemoteRegion] = {
            layer.name: a.engine.import_region(peer, layer.region.descriptor) for layer in b.kv
        }
        assert a.engine.wait_for_connections(WAIT)

    def read(self, layer: RegisteredLayer, local_ids: list[int], remote_ids: list[int]) -> bool:
        plan = plan_transfer(layer.geometry, local_ids, remote_ids, NUM_BLOCKS)
        handle = self.a.engine.post(
            TransferOp.READ,
            layer.region,
            self.remote[layer.name],
            plan.local_offsets,
            plan.remote_offsets,
            plan.sizes,
            layer.name,
        )
        return self.finish(handle)

    def finish(self, handle: TransferHandle) -> bool:
        status = finish(self.a.engine, handle)
        assert status.state is TransferState.SUCCEEDED, status.message
        return True


@pytest.fixture
def link(mori_stand_in: ModuleType) -> Link:
    return Link(Side("a", seed=1), Side("b", seed=2))


def test_layers_in_one_shared_buffer_are_registered_with_mori_once(
    link: Link, mori_stand_in: ModuleType
) -> None:
    for side in (link.a, link.b):
        control = mori_stand_in.control(side.engine.name)
        assert control.registered == [(side.buffer.ctypes.data, side.buffer.nbytes)]
        assert len({layer.region.region_id for layer in side.kv}) == len(side.kv)


def test_each_layer_moves_its_own_blocks_inside_the_shared_buffer(link: Link) -> None:
    before, source = link.a.buffer.copy(), link.b.buffer.copy()
    expected = before.copy()
    rng = np.random.default_rng(3)
    for index, layer in enumerate(link.a.kv):
        local_ids = [int(i) for i in rng.permutation(NUM_BLOCKS)[:5]]
        remote_ids = [int(i) for i in rng.permutation(NUM_BLOCKS)[:5]]
        assert link.read(layer, local_ids, remote_ids)
        mine, theirs = _planes(expected, index), _planes(source, index)
        for lid, rid in zip(local_ids, remote_ids, strict=True):  # the naive per-block copy
            mine[:, lid] = theirs[:, rid]

    np.testing.assert_array_equal(link.a.buffer, expected)
    np.testing.assert_array_equal(link.b.buffer, source)
    assert not np.array_equal(expected, before), "nothing was read"


def test_sessions_are_built_at_import_and_never_on_the_posting_path(
    link: Link, mori_stand_in: ModuleType
) -> None:
    control = mori_stand_in.control(link.a.engine.name)
    assert control.sessions_created == 1, "one local buffer x one remote buffer"
    assert all(link.read(layer, [0, 1], [2, 3]) for layer in link.a.kv)
    assert control.sessions_created == 1
    threads = [thread for call, thread in mori_stand_in.SETUP_CALLS if call == "CreateSession"]
    assert threads
    assert all(name.startswith("moriio-mori-connect") for name in threads), (
        f"a session was built on a thread that imports or posts: {threads}"
    )


def test_each_shared_buffer_is_deregistered_once_after_its_last_layer(
    link: Link, mori_stand_in: ModuleType
) -> None:
    engine = link.a.engine
    control = mori_stand_in.control(engine.name)
    first, *rest = list(link.a.kv)
    engine.deregister_region(first.region)
    with pytest.raises(TransferEngineError, match="not registered"):
        link.read(first, [0], [0])
    assert link.read(rest[0], [0], [1]), "the other layers keep the buffer registered"
    assert control.deregistered == []

    for layer in rest:
        engine.deregister_region(layer.region)
    engine.progress()
    assert control.deregistered == [], "the span (the whole buffer) still lies in it"
    for span in link.a.kv.spans:
        engine.deregister_region(span)
    engine.progress()

    assert len(control.deregistered) == 1
    assert mori_stand_in.find(engine.name).registered_ids() == set()


def test_local_kv_hands_each_buffer_back_once(link: Link, mori_stand_in: ModuleType) -> None:
    link.a.kv.deregister(link.a.engine)
    link.a.engine.progress()
    assert len(mori_stand_in.control(link.a.engine.name).deregistered) == 1


def test_a_layer_outside_the_shared_buffer_still_moves_its_bytes(
    mori_stand_in: ModuleType,
) -> None:
    link = Link(Side("a", seed=4, shared=2, alone=1), Side("b", seed=5, shared=2, alone=1))
    control = mori_stand_in.control(link.a.engine.name)
    assert len(control.registered) == 2, "the shared buffer once, the lone layer once"
    assert control.sessions_created == 4, "every local memory x every remote memory"
    before = [link.b.layer_bytes(i).copy() for i in range(3)]

    for layer in link.a.kv:
        assert link.read(layer, [0, 5, 6], [7, 1, 2])

    assert control.sessions_created == 4
    for index in range(3):
        got = link.a.layer_bytes(index)
        for lid, rid in ((0, 7), (5, 1), (6, 2)):
            np.testing.assert_array_equal(got[:, lid], before[index][:, rid])


def test_a_malformed_or_overreaching_view_descriptor_is_refused(link: Link) -> None:
    from moriio.adapters.mori.views import decode_view, encode_view

    peer = link.a.engine.add_peer(link.b.engine.metadata())
    descriptor = next(iter(link.b.kv)).region.descriptor
    view = decode_view(descriptor)
    assert view is not None
    with pytest.raises(ValueError, match="truncated"):
        link.a.engine.import_region(peer, descriptor[:20])
    too_long = encode_view(type(view)(view.region_id, view.base, 1 << 20, view.memory))
    with pytest.raises(ValueError, match="reaches past"):
        link.a.engine.import_region(peer, too_long)
