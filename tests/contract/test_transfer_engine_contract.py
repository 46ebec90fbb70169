"""One contract for every TransferEngine: the in-memory fake, NIXL for real, mori (stand-in).

Each engine kind comes with a harness that knows how to build engines, drive their progress,
and provoke the conditions the contract talks about (backpressure, a dead peer, a transfer
held in flight). Where an engine cannot show a condition the case is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import numpy.typing as npt
import pytest

from moriio.ports import (
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.testing.inmemory import InMemoryFabric, InMemoryTransferEngine

BLOCK = 4096
NUM_BLOCKS = 16
REGION_BYTES = BLOCK * NUM_BLOCKS
Bytes = npt.NDArray[np.uint8]


def _pattern(seed: int, size: int = REGION_BYTES) -> Bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def _i64(values: list[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.asarray(values, dtype=np.int64)


# -- harnesses ---------------------------------------------------------------------------------


class Harness:
    """Builds engines of one kind and provokes the conditions the contract needs."""

    kind = ""

    def __init__(self) -> None:
        self.engines: list[TransferEngine] = []
        self.buffers: list[Bytes] = []  # kept alive while engines may touch them

    def engine(self, name: str) -> TransferEngine:
        raise NotImplementedError

    def pump(self) -> None:
        """Let every engine make progress (a target with no progress thread needs it)."""
        for engine in self.engines:
            with contextlib.suppress(TransferEngineError):  # closed by the test
                engine.progress()

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        raise NotImplementedError

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        """Keep new posts of ``engine`` in flight; False when the engine cannot."""
        return False

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        """A region imported from a peer that has since died; holds ``_pattern(99)``."""
        raise NotImplementedError

    def close(self) -> None:
        for engine in reversed(self.engines):
            engine.close()


class InMemoryHarness(Harness):
    kind = "inmemory"

    def __init__(self) -> None:
        super().__init__()
        self.fabric = InMemoryFabric()

    def engine(self, name: str) -> TransferEngine:
        engine: TransferEngine = InMemoryTransferEngine(name, self.fabric, complete_after_polls=2)
        self.engines.append(engine)
        return engine

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        assert isinstance(engine, InMemoryTransferEngine)
        engine.inject_backpressure(count)

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        assert isinstance(engine, InMemoryTransferEngine)
        engine.hang = hold
        return True

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        doomed = self.engine("doomed")
        remote = _share_region(self, doomed, initiator, _pattern(99))
        doomed.close()
        return remote


class MoriHarness(Harness):
    kind = "mori"

    def __init__(self, stand_in: ModuleType) -> None:
        super().__init__()
        self.stand_in = stand_in

    def engine(self, name: str) -> TransferEngine:
        from moriio.adapters.mori import MoriTransferEngine

        engine: TransferEngine = MoriTransferEngine(name, host="127.0.0.1", port=0)
        self.engines.append(engine)
        return engine

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        self.stand_in.control(engine.name).sq_full_burst = count

    def hold_completion(self, engine: TransferEngine, hold: bool) -> bool:
        self.stand_in.control(engine.name).hold = hold
        return True

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        doomed = self.engine("doomed")
        remote = _share_region(self, doomed, initiator, _pattern(99))
        self.stand_in.crash(doomed.name)  # the process is gone; nothing was closed
        return remote

    def close(self) -> None:
        super().close()
        self.stand_in.reset()


class NixlHarness(Harness):
    kind = "nixl"

    def __init__(self) -> None:
        super().__init__()
        self.processes: list[subprocess.Popen[str]] = []

    def engine(self, name: str) -> TransferEngine:
        from moriio.adapters.nixl import NixlTransferEngine

        engine: TransferEngine = NixlTransferEngine(f"{name}-{uuid.uuid4().hex[:6]}", loopback=True)
        self.engines.append(engine)
        return engine

    def inject_backpressure(self, engine: TransferEngine, count: int) -> None:
        pytest.skip("NIXL/UCX queues every request itself: it has no transient refusal to report")

    def dead_peer(self, initiator: TransferEngine) -> RemoteRegion:
        script = Path(__file__).with_name("nixl_peer_process.py")
        process = subprocess.Popen(
            [sys.executable, str(script), str(REGION_BYTES)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        assert process.stdout is not None
        lines: dict[str, bytes] = {}
        while len(lines) < 2:
            line = process.stdout.readline()
            assert line, "the NIXL peer process exited before describing its region"
            key, _, value = line.strip().partition(" ")
            if key in ("METADATA", "DESCRIPTOR"):
                lines[key] = bytes.fromhex(value)
        peer = initiator.add_peer(lines["METADATA"])
        remote = initiator.import_region(peer, lines["DESCRIPTOR"])
        # Wire the connection up with one good transfer, then kill the peer.
        scratch = np.zeros(BLOCK, dtype=np.uint8)
        self.buffers.append(scratch)
        local = initiator.register_region(scratch.ctypes.data, scratch.nbytes)
        handle = initiator.post(
            TransferOp.READ, local, remote, _i64([0]), _i64([0]), _i64([BLOCK]), "wire"
        )
        assert wait(self, initiator, handle).state is TransferState.SUCCEEDED
        initiator.release(handle)
        process.kill()
        process.wait()
        return remote

    def close(self) -> None:
        super().close()
        for process in self.processes:
            process.kill()
            process.wait()


# -- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(
    params=[
        "inmemory",
        pytest.param("nixl", marks=pytest.mark.integration),
        "mori",
    ]
)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    built: Harness
    if request.param == "inmemory":
        built = InMemoryHarness()
    elif request.param == "nixl":
        pytest.importorskip("nixl_cu12", reason="NIXL is not installed")
        built = NixlHarness()
    else:
        built = MoriHarness(request.getfixturevalue("mori_stand_in"))
    try:
        yield built
    finally:
        built.close()


@dataclass
class World:
    """Engine ``a`` (initiator) and ``b`` (target), each with one registered buffer."""

    harness: Harness
    a: TransferEngine
    b: TransferEngine
    a_buf: Bytes
    b_buf: Bytes
    a_region: LocalRegion
    b_region: LocalRegion
    peer_b: PeerId
    b_on_a: RemoteRegion

    def post(
        self,
        op: TransferOp,
        local_offsets: list[int] | npt.NDArray[np.int64],
        remote_offsets: list[int] | npt.NDArray[np.int64],
        sizes: list[int] | npt.NDArray[np.int64],
        tag: str = "t",
    ) -> TransferHandle:
        return self.a.post(
            op,
            self.a_region,
            self.b_on_a,
            _i64(local_offsets),
            _i64(remote_offsets),
            _i64(sizes),
            tag,
        )

    def run(self, op: TransferOp, lo: list[int], ro: list[int], sizes: list[int]) -> TransferStatus:
        handle = self.post(op, lo, ro, sizes)
        status = wait(self.harness, self.a, handle)
        self.a.release(handle)
        return status


def _share_region(
    harness: Harness, owner: TransferEngine, importer: TransferEngine, data: Bytes
) -> RemoteRegion:
    harness.buffers.append(data)
    region = owner.register_region(data.ctypes.data, data.nbytes)
    importer.add_peer(owner.metadata())
    owner.add_peer(importer.metadata())
    peer = importer.add_peer(owner.metadata())
    return importer.import_region(peer, region.descriptor)


def wait(harness: Harness, engine: TransferEngine, handle: TransferHandle) -> TransferStatus:
    """Poll until terminal or backpressured (bounded, so a hang fails instead of blocking)."""
    for i in range(40_000):
        status = engine.poll(handle)
        if status.state is not TransferState.IN_PROGRESS:
            return status
        harness.pump()
        if i > 10:
            time.sleep(0.0005)
    raise AssertionError(f"transfer {handle} still in progress after 40000 polls")


@pytest.fixture
def world(harness: Harness) -> World:
    a, b = harness.engine("a"), harness.engine("b")
    a_buf = np.zeros(REGION_BYTES, dtype=np.uint8)
    b_buf = _pattern(1)
    harness.buffers += [a_buf, b_buf]
    a_region = a.register_region(a_buf.ctypes.data, a_buf.nbytes)
    b_region = b.register_region(b_buf.ctypes.data, b_buf.nbytes)
    b.add_peer(a.metadata())
    peer_b = a.add_peer(b.metadata())
    b_on_a = a.import_region(peer_b, b_region.descriptor)
    return World(harness, a, b, a_buf, b_buf, a_region, b_region, peer_b, b_on_a)


def _blocks(ids: list[int] | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return _i64(ids) * BLOCK


# -- the contract ------------------------------------------------------------------------------


def test_register_region_describes_the_memory(harness: Harness) -> None:
    engine = harness.engine("r")
    first, second = np.zeros(BLOCK, np.uint8), np.zeros(2 * BLOCK, np.uint8)
    harness.buffers += [first, second]
    r1 = engine.register_region(first.ctypes.data, first.nbytes)
    r2 = engine.register_region(second.ctypes.data, second.nbytes)
    assert (r1.addr, r1.length, r2.addr, r2.length) == (
        first.ctypes.data,
        BLOCK,
        second.ctypes.data,
        2 * BLOCK,
    )
    assert r1.region_id != r2.region_id
    assert isinstance(r1.descriptor, bytes)
    assert r1.descriptor
    assert r1.descriptor != r2.descriptor


def test_host_regions_work_with_any_device_id(world: World) -> None:
    buf = np.zeros(REGION_BYTES, np.uint8)
    world.harness.buffers.append(buf)
    region = world.a.register_region(buf.ctypes.data, buf.nbytes, MemoryKind.HOST, device_id=-1)
    assert region.device_id == -1
    handle = world.a.post(
        TransferOp.READ, region, world.b_on_a, _i64([0]), _i64([0]), _i64([REGION_BYTES]), "t"
    )
    assert wait(world.harness, world.a, handle).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(buf, world.b_buf)


def test_register_region_rejects_empty_memory(harness: Harness) -> None:
    engine = harness.engine("r")
    with pytest.raises(ValueError, match="length=0"):
        engine.register_region(4096, 0)


def test_read_copies_remote_bytes(world: World) -> None:
    ids = list(range(NUM_BLOCKS))
    status = world.run(
        TransferOp.READ, _blocks(ids).tolist(), _blocks(ids).tolist(), [BLOCK] * NUM_BLOCKS
    )
    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(world.a_buf, world.b_buf)


def test_write_copies_local_bytes(world: World) -> None:
    world.a_buf[:] = _pattern(2)
    status = world.run(TransferOp.WRITE, [0], [0], [REGION_BYTES])
    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(world.b_buf, _pattern(2))


@pytest.mark.parametrize("op", [TransferOp.READ, TransferOp.WRITE])
def test_permuted_block_lists_move_exactly_the_named_blocks(world: World, op: TransferOp) -> None:
    rng = np.random.default_rng(7)
    local_ids = rng.permutation(NUM_BLOCKS)[:10]
    remote_ids = rng.permutation(NUM_BLOCKS)[:10]
    source = world.b_buf if op is TransferOp.READ else world.a_buf
    if op is TransferOp.WRITE:
        world.a_buf[:] = _pattern(3)
        world.b_buf[:] = 0
    before_src = source.copy()
    dest = world.a_buf if op is TransferOp.READ else world.b_buf
    expected = dest.copy().reshape(NUM_BLOCKS, BLOCK)
    src_blocks = before_src.reshape(NUM_BLOCKS, BLOCK)
    if op is TransferOp.READ:
        expected[local_ids] = src_blocks[remote_ids]
    else:
        expected[remote_ids] = src_blocks[local_ids]

    status = world.run(op, _blocks(local_ids).tolist(), _blocks(remote_ids).tolist(), [BLOCK] * 10)

    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(dest, expected.reshape(-1))
    np.testing.assert_array_equal(source, before_src)


def test_byte_granular_descriptors(world: World) -> None:
    lo, ro, sizes = [1, 5000, 30001], [7, 9999, 60000], [1, 777, 5536]
    status = world.run(TransferOp.READ, lo, ro, sizes)
    assert status.state is TransferState.SUCCEEDED, status.message
    expected = np.zeros(REGION_BYTES, np.uint8)
    for l_off, r_off, n in zip(lo, ro, sizes, strict=True):
        expected[l_off : l_off + n] = world.b_buf[r_off : r_off + n]
    np.testing.assert_array_equal(world.a_buf, expected)


def test_empty_batch_succeeds_without_moving_bytes(world: World) -> None:
    status = world.run(TransferOp.READ, [], [], [])
    assert status.state is TransferState.SUCCEEDED
    assert not world.a_buf.any()


def test_backpressure_then_success(world: World) -> None:
    world.harness.inject_backpressure(world.a, 2)
    for _ in range(2):
        status = world.run(TransferOp.READ, [0], [0], [REGION_BYTES])
        assert status.state is TransferState.BACKPRESSURE
        assert status.message
        assert not world.a_buf.any(), "a backpressured post must not move bytes"
    status = world.run(TransferOp.READ, [0], [0], [REGION_BYTES])
    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(world.a_buf, world.b_buf)


def test_dead_peer_gives_a_sticky_terminal_failure(world: World) -> None:
    remote = world.harness.dead_peer(world.a)
    world.a_buf[:] = 0
    handle = world.a.post(
        TransferOp.READ, world.a_region, remote, _i64([0]), _i64([0]), _i64([BLOCK]), "doomed"
    )
    status = wait(world.harness, world.a, handle)
    assert status.state is TransferState.FAILED
    assert status.state.is_terminal
    assert status.message
    assert world.a.poll(handle) == status, "a terminal failure must not change"
    world.a.release(handle)
    with pytest.raises(TransferEngineError):
        world.a.poll(handle)


def test_remove_peer_fails_in_flight_work_and_refuses_new_work(world: World) -> None:
    held = world.harness.hold_completion(world.a, True)
    in_flight = world.post(TransferOp.READ, [0], [0], [BLOCK])
    if held:
        assert world.a.poll(in_flight).state is TransferState.IN_PROGRESS
    world.a.remove_peer(world.peer_b)
    world.harness.hold_completion(world.a, False)

    final = world.a.poll(in_flight)
    assert final.state.is_terminal
    if held:
        assert final.state is TransferState.FAILED
        assert world.peer_b in final.message
    with pytest.raises(TransferEngineError):
        world.post(TransferOp.READ, [0], [0], [BLOCK])
    with pytest.raises(TransferEngineError):
        world.a.import_region(world.peer_b, world.b_region.descriptor)

    peer = world.a.add_peer(world.b.metadata())
    world.b_on_a = world.a.import_region(peer, world.b_region.descriptor)
    world.a_buf[:] = 0
    status = world.run(TransferOp.READ, [0], [0], [REGION_BYTES])
    assert status.state is TransferState.SUCCEEDED, status.message
    np.testing.assert_array_equal(world.a_buf, world.b_buf)


@pytest.mark.parametrize(
    ("lo", "ro", "size"),
    [
        (0, REGION_BYTES - BLOCK + 1, BLOCK),  # remote end one byte past the region
        (REGION_BYTES - 1, 0, 2),  # local end past the region
        (0, -BLOCK, BLOCK),  # negative remote offset
        (-1, 0, BLOCK),  # negative local offset
        (0, 0, 0),  # empty descriptor
        (0, 0, -BLOCK),  # negative size
        (0, 2**62, BLOCK),  # far outside
    ],
)
def test_out_of_region_descriptors_are_refused_before_any_byte_moves(
    world: World, lo: int, ro: int, size: int
) -> None:
    with pytest.raises(TransferEngineError, match="descriptor 1"):
        world.post(TransferOp.READ, [0, lo], [0, ro], [BLOCK, size])
    with pytest.raises(TransferEngineError, match="descriptor 1"):
        world.post(TransferOp.WRITE, [0, lo], [0, ro], [BLOCK, size])
    assert not world.a_buf.any()
    np.testing.assert_array_equal(world.b_buf, _pattern(1))


def test_mismatched_descriptor_arrays_are_rejected(world: World) -> None:
    with pytest.raises(ValueError, match="differ in length"):
        world.post(TransferOp.READ, [0, BLOCK], [0], [BLOCK, BLOCK])


def test_unknown_regions_are_refused(world: World) -> None:
    forged = RemoteRegion(world.peer_b, world.b_on_a.region_id + 1000, REGION_BYTES)
    with pytest.raises(TransferEngineError, match="not imported"):
        world.a.post(TransferOp.READ, world.a_region, forged, _i64([0]), _i64([0]), _i64([1]), "t")
    world.a.deregister_region(world.a_region)
    with pytest.raises(TransferEngineError, match="not registered"):
        world.post(TransferOp.READ, [0], [0], [1])


def test_import_region_checks_the_owner(world: World) -> None:
    c = world.harness.engine("c")
    peer_c = world.a.add_peer(c.metadata())
    with pytest.raises(TransferEngineError):
        world.a.import_region(peer_c, world.b_region.descriptor)


def test_add_peer_is_idempotent(world: World) -> None:
    assert world.a.add_peer(world.b.metadata()) == world.peer_b
    assert world.a.add_peer(world.b.metadata()) == world.peer_b
    assert world.peer_b == world.b.name


def test_release_forgets_the_handle(world: World) -> None:
    handle = world.post(TransferOp.READ, [0], [0], [BLOCK])
    assert wait(world.harness, world.a, handle).state is TransferState.SUCCEEDED
    world.a.release(handle)
    world.a.release(handle)
    with pytest.raises(TransferEngineError, match="unknown or released"):
        world.a.poll(handle)


def test_progress_never_blocks_and_keeps_transfers_moving(world: World) -> None:
    handle = world.post(TransferOp.READ, [0], [0], [REGION_BYTES])
    for _ in range(3):
        world.a.progress()
        world.b.progress()
    assert wait(world.harness, world.a, handle).state is TransferState.SUCCEEDED
    np.testing.assert_array_equal(world.a_buf, world.b_buf)


def test_closed_engine_refuses_work(world: World) -> None:
    world.a.close()
    world.a.close()
    with pytest.raises(TransferEngineError, match="closed"):
        world.post(TransferOp.READ, [0], [0], [BLOCK])
    with pytest.raises(TransferEngineError, match="closed"):
        world.a.progress()
