"""mori's descriptors as mori 1.2.4 unpacks them, checked by the adapter before mori dials.

``EngineDesc`` / ``MemoryDesc`` are msgpack arrays (``MSGPACK_DEFINE``); msgpack-c's unpack
fills missing trailing fields with defaults and ignores extra ones. So ``b"\\x90"`` is an
engine with an empty key and port 0, and the 1.2.5 nightly's extra ``backendDescs`` field is
accepted: the adapter must check what it got.
"""

from __future__ import annotations

from types import ModuleType

import msgpack
import numpy as np
import pytest

from moriio.adapters.mori import MoriTransferEngine
from moriio.ports import TransferState
from support.mori_pair import SIZE, Pair


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b"\x90", "empty engine key"),  # an empty array: every field defaulted
        (msgpack.packb(["k", "n", "h", "10.0.0.1"]), "no dialable port"),  # port missing: 0
        (msgpack.packb(["k", "n", "h", "10.0.0.1", 1, 7]), "no dialable port"),  # XGMI sentinel
        (msgpack.packb(["k", "n", "h", "", 7000, 7]), "IPv4"),
        (msgpack.packb({"key": "k"}), "malformed"),  # not an array: msgpack-c throws
        (msgpack.packb([1, "n", "h", "10.0.0.1", 7000, 7]), "malformed"),  # wrong type
    ],
)
def test_an_unusable_engine_descriptor_is_refused(
    mori_stand_in: ModuleType, raw: bytes, match: str
) -> None:
    engine = MoriTransferEngine("k")
    with pytest.raises(ValueError, match=match):
        engine.add_peer(raw)


def test_the_nightly_s_extra_descriptor_field_interoperates(mori_stand_in: ModuleType) -> None:
    mori_stand_in.NIGHTLY = True  # b packs 1.2.5.dev's EngineDesc: one field more
    pair = Pair()
    assert len(msgpack.unpackb(pair.b.metadata())) == 7
    assert pair.finish(pair.read()).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)


@pytest.mark.parametrize(
    "fields",
    [
        [],  # engine key empty
        ["b@x", 0, -1, "", 0x1000, 0],  # no bytes
        ["b@x", 0, -1, "", 0x1000, 4096, 0],  # location Unknown
    ],
)
def test_an_unusable_memory_descriptor_is_refused(
    mori_stand_in: ModuleType, fields: list[object]
) -> None:
    pair = Pair()
    with pytest.raises(ValueError, match="no usable memory"):
        pair.a.import_region(pair.peer, msgpack.packb(fields))


def test_memory_descriptors_carry_the_ipc_offset(mori_stand_in: ModuleType) -> None:
    from mori.io import MemoryDesc

    pair = Pair()
    desc = MemoryDesc.unpack(pair.b_region.descriptor)
    assert (desc.ipc_offset, desc.size) == (0, SIZE)
    assert len(msgpack.unpackb(pair.b_region.descriptor)) == 15  # 1.2.4's field count
