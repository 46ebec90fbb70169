"""The mori adapter against the real mori package: needs ROCm and an active RDMA NIC."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from moriio.ports import (
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)

Pair = tuple[TransferEngine, TransferEngine]


def _real_mori_available() -> bool:
    try:
        import mori
        import mori.io  # loads the native libraries
    except Exception:
        return False
    return not getattr(mori, "STAND_IN", False)


pytestmark = [
    pytest.mark.mori_hardware,
    pytest.mark.skipif(
        not _real_mori_available(), reason="needs the real mori package, ROCm and an RDMA NIC"
    ),
]

BLOCK = 64 * 1024
BLOCKS = 64


def _wait(engine: TransferEngine, handle: TransferHandle) -> TransferStatus:
    for _ in range(1_000_000):
        status = engine.poll(handle)
        if status.state is not TransferState.IN_PROGRESS:
            return status
    raise AssertionError("mori transfer still in progress")


@pytest.fixture
def engines(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pair]:
    from moriio.adapters.mori import MoriTransferEngine

    monkeypatch.setenv("MORI_DISABLE_AUTO_XGMI", "1")
    a = MoriTransferEngine("moriio-hw-a", host="127.0.0.1", port=0)
    b = MoriTransferEngine("moriio-hw-b", host="127.0.0.1", port=0)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("op", [TransferOp.READ, TransferOp.WRITE])
def test_permuted_blocks_over_rdma(engines: Pair, op: TransferOp) -> None:
    a, b = engines
    a_buf = np.zeros(BLOCK * BLOCKS, np.uint8)
    b_buf = np.random.default_rng(0).integers(0, 256, BLOCK * BLOCKS, dtype=np.uint8)
    if op is TransferOp.WRITE:
        a_buf, b_buf = b_buf.copy(), np.zeros_like(b_buf)
    a_region = a.register_region(a_buf.ctypes.data, a_buf.nbytes)
    b_region = b.register_region(b_buf.ctypes.data, b_buf.nbytes)
    b.add_peer(a.metadata())
    remote = a.import_region(a.add_peer(b.metadata()), b_region.descriptor)
    perm = np.random.default_rng(1).permutation(BLOCKS)
    local_offsets = np.arange(BLOCKS, dtype=np.int64) * BLOCK
    remote_offsets = perm.astype(np.int64) * BLOCK
    sizes = np.full(BLOCKS, BLOCK, np.int64)

    handle = a.post(op, a_region, remote, local_offsets, remote_offsets, sizes, "hw")
    status = _wait(a, handle)

    assert status.state is TransferState.SUCCEEDED, status.message
    local_blocks = a_buf.reshape(BLOCKS, BLOCK)
    remote_blocks = b_buf.reshape(BLOCKS, BLOCK)
    np.testing.assert_array_equal(local_blocks, remote_blocks[perm])


def test_removed_peer_refuses_new_posts(engines: Pair) -> None:
    a, b = engines
    buf = np.zeros(BLOCK, np.uint8)
    peer_buf = np.ones(BLOCK, np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    peer_region = b.register_region(peer_buf.ctypes.data, peer_buf.nbytes)
    b.add_peer(a.metadata())
    peer = a.add_peer(b.metadata())
    remote = a.import_region(peer, peer_region.descriptor)
    a.remove_peer(peer)
    zero = np.zeros(1, np.int64)
    with pytest.raises(TransferEngineError):
        a.post(TransferOp.READ, region, remote, zero, zero, np.array([BLOCK]), "gone")
