"""The mori adapter against the real mori package: needs ROCm and an active RDMA NIC.

Covers what the stand-in imitates from mori's source: a restarted peer under the same name,
a dead peer's error completion and the rebuilt connection, SQ-full back-pressure (one queue
pair, and four with the first chain refused), bytes that land after ``remove_peer`` until the
engine reports the peer quiet, and mori 1.2.4's surface (``pop_peer_failure``, ``alive``,
lenient descriptors, set-up calls that hold the interpreter lock). What only hardware can show
and these tests cannot inject: a real fatal async event (pull a cable or ``ip link set ...
down`` on the RDMA interface while ``test_a_downed_port_moves_the_peer`` waits, run with
``MORIIO_TEST_PORT_FLAP=1``), the real retry budget, and the real ``max_msg_sz``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import numpy as np
import pytest

from moriio.ports import (
    LocalRegion,
    RemoteRegion,
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
    a = MoriTransferEngine("moriio-hw-a", host=HOST, port=0)
    b = MoriTransferEngine("moriio-hw-b", host=HOST, port=0)
    yield a, b
    a.close()
    b.close()


HOST = os.environ.get("MORIIO_TEST_RDMA_HOST", "127.0.0.1")


def _connect(a: TransferEngine, b: TransferEngine, b_buf: np.ndarray) -> RemoteRegion:
    b_region = b.register_region(b_buf.ctypes.data, b_buf.nbytes)
    b.add_peer(a.metadata())
    return a.import_region(a.add_peer(b.metadata()), b_region.descriptor)


def _read_all(a: TransferEngine, region: LocalRegion, remote: RemoteRegion) -> TransferStatus:
    zero = np.zeros(1, np.int64)
    size = np.array([min(region.length, remote.length)], np.int64)
    return _wait(a, a.post(TransferOp.READ, region, remote, zero, zero, size, "hw"))


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


def test_restarted_peer_with_the_same_name_is_reachable(engines: Pair) -> None:
    from moriio.adapters.mori import MoriTransferEngine

    a, b = engines
    buf = np.zeros(BLOCK, np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    first = np.full(BLOCK, 1, np.uint8)
    assert _read_all(a, region, _connect(a, b, first)).state is TransferState.SUCCEEDED
    b.close()  # the process is gone: its QPs and region keys with it

    again = MoriTransferEngine("moriio-hw-b", host=HOST, port=0)  # region ids restart at 0
    try:
        second = np.full(BLOCK, 2, np.uint8)
        status = _read_all(a, region, _connect(a, again, second))
        assert status.state is TransferState.SUCCEEDED, status.message
        np.testing.assert_array_equal(buf, second)
    finally:
        again.close()


def test_dead_peer_fails_and_a_live_peer_works_after_a_rebuild(engines: Pair) -> None:
    from moriio.adapters.mori import MoriTransferEngine

    a, b = engines
    buf = np.zeros(BLOCK, np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    doomed = MoriTransferEngine("moriio-hw-doomed", host=HOST, port=0)
    doomed_buf = np.ones(BLOCK, np.uint8)
    lost = _connect(a, doomed, doomed_buf)
    doomed.close()
    assert _read_all(a, region, lost).state is TransferState.FAILED

    peer_buf = np.full(BLOCK, 3, np.uint8)
    status = _read_all(a, region, _connect(a, b, peer_buf))
    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(buf, peer_buf)


def test_sq_full_is_backpressure_then_success(engines: Pair) -> None:
    a, b = engines
    many = 4 * 8192  # more single-byte WRs in flight than one send queue holds
    buf = np.zeros(many, np.uint8)
    peer_buf = np.random.default_rng(2).integers(0, 256, many, dtype=np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    remote = _connect(a, b, peer_buf)
    offsets = np.arange(0, many, 2, dtype=np.int64)  # non-contiguous: no merging
    ones = np.ones(offsets.size // 4, np.int64)
    parts = np.split(offsets, 4)
    handles = [a.post(TransferOp.READ, region, remote, p, p, ones, "sq") for p in parts]
    for part, handle in zip(parts, handles, strict=True):
        state = _wait(a, handle).state
        assert state in (TransferState.SUCCEEDED, TransferState.BACKPRESSURE)
        if state is TransferState.BACKPRESSURE:  # one post chain: nothing was posted
            again = a.post(TransferOp.READ, region, remote, part, part, ones, "sq")
            assert _wait(a, again).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(buf[offsets], peer_buf[offsets])


def test_remove_peer_in_flight_until_quiet(engines: Pair) -> None:
    from moriio.adapters.mori import MoriTransferEngine

    a, b = engines
    assert isinstance(a, MoriTransferEngine)
    size = 256 * 1024 * 1024
    buf = np.zeros(size, np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    peer_buf = np.full(size, 5, np.uint8)
    remote = _connect(a, b, peer_buf)
    zero = np.zeros(1, np.int64)
    handle = a.post(TransferOp.READ, region, remote, zero, zero, np.array([size]), "big")
    a.remove_peer(remote.peer)
    assert a.poll(handle).state is TransferState.FAILED
    deadline = time.monotonic() + 10
    while not a.quiet(peer=remote.peer):
        assert time.monotonic() < deadline, "the removed peer's transfer never went quiet"
        time.sleep(0.01)


def test_mori_1_2_4_surface_is_there() -> None:
    import mori.io

    engine = mori.io.IOEngine("moriio-hw-surface", mori.io.IOEngineConfig(host=HOST, port=0))
    assert callable(getattr(engine, "pop_peer_failure", None)), "amd-mori >= 1.2.4 expected"
    assert engine.pop_peer_failure() is None
    assert mori.io.EngineDesc.unpack(b"\x90").key == ""  # lenient: the adapter must check


def test_a_post_made_before_its_session_exists_waits_for_it(engines: Pair) -> None:
    """Sessions are built on the adapter's thread (mori's CreateSession holds the GIL): a
    post right after the import waits for its session, then moves the bytes."""
    a, b = engines
    buf, peer_buf = np.zeros(BLOCK, np.uint8), np.full(BLOCK, 4, np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    remote = _connect(a, b, peer_buf)  # returns before the sessions exist
    status = _read_all(a, region, remote)
    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(buf, peer_buf)


def test_sq_full_on_four_queue_pairs_is_backpressure_then_success(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from moriio.adapters.mori import MoriTransferEngine

    monkeypatch.setenv("MORI_DISABLE_AUTO_XGMI", "1")
    monkeypatch.setenv("MORI_IO_QP_MAX_SEND_WR", "64")
    monkeypatch.setenv("MORI_IO_SQ_BACKOFF_TIMEOUT_US", "1000")
    a = MoriTransferEngine("moriio-hw-qp4-a", host=HOST, port=0, qp_per_transfer=4)
    b = MoriTransferEngine("moriio-hw-qp4-b", host=HOST, port=0, qp_per_transfer=4)
    try:
        many = 4 * 256
        buf = np.zeros(2 * many, np.uint8)
        peer_buf = np.random.default_rng(3).integers(0, 256, 2 * many, dtype=np.uint8)
        region = a.register_region(buf.ctypes.data, buf.nbytes)
        remote = _connect(a, b, peer_buf)
        offsets = np.arange(0, 2 * many, 2, dtype=np.int64)  # gaps: one WR each
        ones = np.ones(offsets.size, np.int64)
        handles = [a.post(TransferOp.READ, region, remote, offsets, offsets, ones, "q4")]
        handles += [a.post(TransferOp.READ, region, remote, offsets, offsets, ones, "q4")]
        states = [_wait(a, h).state for h in handles]
        assert all(s is not TransferState.IN_PROGRESS for s in states)
        assert TransferState.SUCCEEDED in states
    finally:
        a.close()
        b.close()


@pytest.mark.skipif(
    os.environ.get("MORIIO_TEST_PORT_FLAP") != "1", reason="needs someone to take the port down"
)
def test_a_downed_port_moves_the_peer(engines: Pair) -> None:
    a, b = engines
    buf, peer_buf = np.zeros(BLOCK, np.uint8), np.full(BLOCK, 9, np.uint8)
    region = a.register_region(buf.ctypes.data, buf.nbytes)
    remote = _connect(a, b, peer_buf)
    assert _read_all(a, region, remote).state is TransferState.SUCCEEDED
    print("take the RDMA port down now, then up again within 60 s")
    deadline = time.monotonic() + 120
    saw_failure = False
    while time.monotonic() < deadline:
        a.progress()
        state = _read_all(a, region, remote).state
        saw_failure |= state is TransferState.FAILED
        if saw_failure and state is TransferState.SUCCEEDED:
            return  # reached again on a new connection, no restart
        time.sleep(0.5)
    raise AssertionError("the port flap was not seen, or the peer was never reached again")
