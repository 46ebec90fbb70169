"""Spans: each allocation that two layers or more lie in is registered once more, whole, and
each of those layers knows its place in it; handshakes carry both."""

from __future__ import annotations

import numpy as np
import pytest

from moriio.domain.kv.layout import LayerSpec
from moriio.domain.kv.request_plan import Placement
from moriio.domain.protocol.messages import MAX_SPANS
from moriio.domain.worker.kv_registry import LayerTensor, LocalKV
from moriio.ports import Allocation, TransferEngineError
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine

SPEC = LayerSpec(block_size=1, num_kv_heads=1, head_size=8)
SHAPE, STRIDES = (2, 4, 1, 1, 8), (32, 8, 8, 8, 1)  # 64 bytes per layer (uint8)


def _tensor(name: str, addr: int, storage: Allocation | None) -> LayerTensor:
    return LayerTensor(name, addr, SHAPE, STRIDES, 1, "uint8", SPEC, storage=storage)


def test_layers_in_one_allocation_get_a_span_and_their_places_in_it() -> None:
    engine = InMemoryTransferEngine("w", InMemoryFabric())
    shared, single, alone = (np.zeros(n, np.uint8) for n in (4096, 1024, 64))
    whole = Allocation(shared.ctypes.data, shared.nbytes)
    lonely = Allocation(single.ctypes.data, single.nbytes)
    kv = LocalKV.register(
        engine,
        [
            _tensor("a", whole.addr + 128, whole),
            _tensor("b", whole.addr + 1024, whole),
            _tensor("c", alone.ctypes.data, None),
            _tensor("d", lonely.addr, lonely),  # the only layer of its allocation
        ],
    )
    (span,) = kv.spans
    assert (span.addr, span.length) == (whole.addr, whole.length)
    places = {layer.name: layer.placement for layer in kv}
    assert places == {"a": Placement(0, 128), "b": Placement(0, 1024), "c": None, "d": None}
    regions = {r.name: (r.span, r.span_offset) for r in kv.layer_regions()}
    assert regions == {"a": (0, 128), "b": (0, 1024), "c": (-1, 0), "d": (-1, 0)}
    assert kv.span_descriptors() == (span.descriptor,)
    kv.deregister(engine)
    with pytest.raises(TransferEngineError, match="not registered"):
        engine.deregister_region(span)


def test_no_more_spans_than_a_handshake_carries() -> None:
    engine = InMemoryTransferEngine("w", InMemoryFabric())
    buffers = [np.zeros(256, np.uint8) for _ in range(MAX_SPANS + 2)]
    tensors = []
    for i, buf in enumerate(buffers):
        whole = Allocation(buf.ctypes.data, buf.nbytes)
        tensors += [_tensor(f"{i}.k", whole.addr, whole), _tensor(f"{i}.v", whole.addr + 64, whole)]
    kv = LocalKV.register(engine, tensors)
    assert len(kv.spans) == MAX_SPANS
    assert [layer.placement is None for layer in kv][-4:] == [True] * 4


def test_a_failed_registration_gives_every_region_back(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = InMemoryTransferEngine("w", InMemoryFabric())
    buf = np.zeros(4096, np.uint8)
    whole = Allocation(buf.ctypes.data, buf.nbytes)
    register, calls, given_back = engine.register_region, [], []

    def third_fails(*args: object, **kwargs: object) -> object:
        calls.append(args)
        if len(calls) == 3:  # the span, after both layers
            raise TransferEngineError("no more memory")
        return register(*args, **kwargs)  # type: ignore[arg-type]

    deregister = engine.deregister_region
    monkeypatch.setattr(engine, "register_region", third_fails)
    monkeypatch.setattr(engine, "deregister_region", lambda r: given_back.append(deregister(r)))
    with pytest.raises(TransferEngineError, match="no more memory"):
        LocalKV.register(
            engine, [_tensor("a", whole.addr, whole), _tensor("b", whole.addr + 64, whole)]
        )
    assert len(given_back) == 2
