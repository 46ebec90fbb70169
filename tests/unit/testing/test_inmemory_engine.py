"""In-memory engine knobs and records (the contract suite covers the port behaviour)."""

from __future__ import annotations

import numpy as np
import pytest

from moriio.ports import (
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
)
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine

SIZE = 4096


class Pair:
    def __init__(self, **knobs: int) -> None:
        self.fabric = InMemoryFabric()
        self.a = InMemoryTransferEngine("a", self.fabric, **knobs)
        self.b = InMemoryTransferEngine("b", self.fabric)
        self.a_buf = np.zeros(SIZE, np.uint8)
        self.b_buf = np.arange(SIZE, dtype=np.int64).astype(np.uint8)
        self.a_region = self.a.register_region(self.a_buf.ctypes.data, SIZE)
        self.b_region = self.b.register_region(self.b_buf.ctypes.data, SIZE)
        self.peer = self.a.add_peer(self.b.metadata())
        self.remote = self.a.import_region(self.peer, self.b_region.descriptor)

    def read(self, tag: str = "t") -> TransferHandle:
        zero = np.zeros(1, np.int64)
        return self.a.post(
            TransferOp.READ, self.a_region, self.remote, zero, zero, np.array([SIZE]), tag
        )

    def polls_until_done(self, handle: TransferHandle) -> int:
        for n in range(1, 1000):
            if self.a.poll(handle).state is not TransferState.IN_PROGRESS:
                return n
        raise AssertionError("never completed")


def test_conforms_to_the_port() -> None:
    engine: TransferEngine = InMemoryTransferEngine("x", InMemoryFabric())
    assert engine.name == "x"


def test_bytes_move_on_the_completing_poll() -> None:
    pair = Pair(complete_after_polls=2)
    handle = pair.read()
    assert pair.a.poll(handle).state is TransferState.IN_PROGRESS
    assert pair.a.poll(handle).state is TransferState.IN_PROGRESS
    assert not pair.a_buf.any()
    assert pair.a.poll(handle).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(pair.a_buf, pair.b_buf)
    assert pair.a.polls == 3
    pair.a.progress()
    assert pair.a.progress_calls == 1


def test_jitter_is_reproducible_from_the_seed() -> None:
    def poll_counts(seed: int) -> list[int]:
        pair = Pair(complete_after_polls=1, jitter_polls=5, seed=seed)
        return [pair.polls_until_done(pair.read()) for _ in range(20)]

    first = poll_counts(11)
    assert first == poll_counts(11)
    assert min(first) >= 2
    assert max(first) <= 7
    assert len(set(first)) > 1


def test_backpressure_burst_then_normal_posts() -> None:
    pair = Pair()
    pair.a.inject_backpressure(2)
    states = [pair.a.poll(pair.read()).state for _ in range(3)]
    assert states == [TransferState.BACKPRESSURE] * 2 + [TransferState.SUCCEEDED]
    assert [r.outcome for r in pair.a.posted] == [
        TransferState.BACKPRESSURE,
        TransferState.BACKPRESSURE,
        TransferState.IN_PROGRESS,
    ]


def test_injected_failures_are_terminal_with_their_message() -> None:
    pair = Pair()
    pair.a.inject_failures(1, "link down")
    handle = pair.read()
    assert pair.a.poll(handle).state is TransferState.FAILED
    assert pair.a.poll(handle).message == "link down"
    assert not pair.a_buf.any()
    assert pair.a.poll(pair.read()).state is TransferState.SUCCEEDED


def test_hang_never_completes_until_peer_removed() -> None:
    pair = Pair()
    pair.a.hang = True
    handle = pair.read()
    for _ in range(50):
        assert pair.a.poll(handle).state is TransferState.IN_PROGRESS
    pair.a.remove_peer(pair.peer)
    status = pair.a.poll(handle)
    assert status.state is TransferState.FAILED
    assert "removed" in status.message


def test_records_what_was_posted_and_released() -> None:
    pair = Pair()
    handle = pair.read(tag="req-1:layer-0")
    pair.a.release(handle)
    (record,) = pair.a.posted
    assert (record.handle, record.op, record.tag, record.peer) == (
        handle,
        TransferOp.READ,
        "req-1:layer-0",
        "b",
    )
    assert record.sizes.tolist() == [SIZE]
    assert not record.sizes.flags.writeable
    assert pair.a.released == [handle]


def test_peer_that_left_the_fabric_fails_the_transfer() -> None:
    pair = Pair(complete_after_polls=1)
    handle = pair.read()
    pair.b.close()
    pair.a.poll(handle)
    status = pair.a.poll(handle)
    assert status.state is TransferState.FAILED
    assert "unreachable" in status.message


def test_deregistered_remote_region_fails_the_transfer() -> None:
    pair = Pair()
    pair.b.deregister_region(pair.b_region)
    status = pair.a.poll(pair.read())
    assert status.state is TransferState.FAILED
    assert "remote region" in status.message


def test_names_are_unique_on_a_fabric() -> None:
    fabric = InMemoryFabric()
    InMemoryTransferEngine("x", fabric)
    with pytest.raises(ValueError, match="already on this fabric"):
        InMemoryTransferEngine("x", fabric)


def test_unknown_peer_metadata_is_refused() -> None:
    pair = Pair()
    other = InMemoryTransferEngine("elsewhere", InMemoryFabric())
    with pytest.raises(TransferEngineError, match="no engine named 'elsewhere'"):
        pair.a.add_peer(other.metadata())


def test_malformed_descriptor_is_a_value_error() -> None:
    pair = Pair()
    with pytest.raises(ValueError, match="malformed region descriptor"):
        pair.a.import_region(pair.peer, b"\x00garbage")
