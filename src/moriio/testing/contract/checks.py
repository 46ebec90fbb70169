"""The contract every TransferEngine keeps, one check function per promise."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from moriio.ports import (
    Allocation,
    MemoryKind,
    RemoteRegion,
    TransferEngine,
    TransferEngineError,
    TransferOp,
    TransferState,
)
from moriio.testing.contract.harness import (
    BLOCK,
    MAX_POLLS,
    NUM_BLOCKS,
    REGION_BYTES,
    EngineHarness,
    Int64s,
    UnsupportedConditionError,
    World,
    expect,
    i64,
    pattern,
    raises,
    wait,
)
from moriio.testing.contract.settle_checks import (
    cancel_after_success_changes_nothing,
    cancel_keeps_the_batch_known_until_it_settles,
    finished_batches_are_settled,
    release_in_flight_forgets_the_batch_and_the_engine_goes_on,
    transfers_complete_while_only_the_initiator_drives_progress,
)

assert_equal = np.testing.assert_array_equal


@dataclass(frozen=True)
class Check:
    """One promise of the contract, run against a fresh harness."""

    name: str
    run: Callable[[EngineHarness], None]


def _blocks(ids: list[int] | Int64s) -> Int64s:
    return i64(ids) * BLOCK


def register_region_describes_the_memory(harness: EngineHarness) -> None:
    engine = harness.engine("r")
    first, second = np.zeros(BLOCK, np.uint8), np.zeros(2 * BLOCK, np.uint8)
    harness.buffers += [first, second]
    r1 = engine.register_region(first.ctypes.data, first.nbytes)
    r2 = engine.register_region(second.ctypes.data, second.nbytes)
    expect(
        (r1.addr, r1.length, r2.addr, r2.length)
        == (first.ctypes.data, BLOCK, second.ctypes.data, 2 * BLOCK),
        "a region must report the address and length it was registered with",
    )
    expect(r1.region_id != r2.region_id, "two regions share one id")
    expect(isinstance(r1.descriptor, bytes) and bool(r1.descriptor), "empty region descriptor")
    expect(r1.descriptor != r2.descriptor, "two regions share one descriptor")


def host_regions_work_with_any_device_id(harness: EngineHarness) -> None:
    world = World.build(harness)
    buf = np.zeros(REGION_BYTES, np.uint8)
    harness.buffers.append(buf)
    region = world.a.register_region(buf.ctypes.data, buf.nbytes, MemoryKind.HOST, device_id=-1)
    expect(region.device_id == -1, f"device_id {region.device_id}, registered with -1")
    handle = world.a.post(
        TransferOp.READ, region, world.b_on_a, i64([0]), i64([0]), i64([REGION_BYTES]), "t"
    )
    status = wait(harness, world.a, handle)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(buf, world.b_buf)


def register_region_rejects_empty_memory(harness: EngineHarness) -> None:
    engine = harness.engine("r")
    with raises(ValueError, match="length=0"):
        engine.register_region(4096, 0)


def regions_in_one_allocation_move_their_own_bytes(harness: EngineHarness) -> None:
    a, b = harness.engine("a"), harness.engine("b")
    a_buf, b_buf, half = np.zeros(REGION_BYTES, np.uint8), pattern(5), REGION_BYTES // 2
    harness.buffers += [a_buf, b_buf]
    a_all, b_all = (Allocation(x.ctypes.data, x.nbytes) for x in (a_buf, b_buf))
    low = a.register_region(a_all.addr, half, allocation=a_all)
    high = a.register_region(a_all.addr + half, half, allocation=a_all)
    theirs = b.register_region(b_all.addr + half, half, allocation=b_all)
    b.add_peer(a.metadata())
    remote = a.import_region(a.add_peer(b.metadata()), theirs.descriptor)
    sizes = i64([BLOCK, BLOCK])
    handle = a.post(TransferOp.READ, high, remote, i64([0, BLOCK]), i64([BLOCK, 0]), sizes, "t")
    status = wait(harness, a, handle)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    expected = np.zeros(REGION_BYTES, np.uint8)
    expected[half : half + BLOCK] = b_buf[half + BLOCK : half + 2 * BLOCK]
    expected[half + BLOCK : half + 2 * BLOCK] = b_buf[half : half + BLOCK]
    assert_equal(a_buf, expected)
    with raises(TransferEngineError):  # offsets stay relative to the region, not the allocation
        a.post(TransferOp.READ, low, remote, i64([half]), i64([0]), i64([BLOCK]), "t")
    with raises(ValueError):
        a.register_region(a_all.addr + half, half + 1, allocation=a_all)
    a.deregister_region(low)
    a.deregister_region(high)


def read_copies_remote_bytes(harness: EngineHarness) -> None:
    world = World.build(harness)
    ids = list(range(NUM_BLOCKS))
    status = world.run(
        TransferOp.READ, _blocks(ids).tolist(), _blocks(ids).tolist(), [BLOCK] * NUM_BLOCKS
    )
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.a_buf, world.b_buf)


def write_copies_local_bytes(harness: EngineHarness) -> None:
    world = World.build(harness)
    world.a_buf[:] = pattern(2)
    status = world.run(TransferOp.WRITE, [0], [0], [REGION_BYTES])
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.b_buf, pattern(2))


def permuted_block_lists_move_exactly_the_named_blocks(
    op: TransferOp, harness: EngineHarness
) -> None:
    world = World.build(harness)
    rng = np.random.default_rng(7)
    local_ids = rng.permutation(NUM_BLOCKS)[:10]
    remote_ids = rng.permutation(NUM_BLOCKS)[:10]
    source = world.b_buf if op is TransferOp.READ else world.a_buf
    if op is TransferOp.WRITE:
        world.a_buf[:] = pattern(3)
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

    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(dest, expected.reshape(-1))
    assert_equal(source, before_src)


def byte_granular_descriptors(harness: EngineHarness) -> None:
    world = World.build(harness)
    lo, ro, sizes = [1, 5000, 30001], [7, 9999, 60000], [1, 777, 5536]
    status = world.run(TransferOp.READ, lo, ro, sizes)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    expected = np.zeros(REGION_BYTES, np.uint8)
    for l_off, r_off, n in zip(lo, ro, sizes, strict=True):
        expected[l_off : l_off + n] = world.b_buf[r_off : r_off + n]
    assert_equal(world.a_buf, expected)


def empty_batch_succeeds_without_moving_bytes(harness: EngineHarness) -> None:
    world = World.build(harness)
    status = world.run(TransferOp.READ, [], [], [])
    expect(status.state is TransferState.SUCCEEDED, status.message)
    expect(not world.a_buf.any(), "an empty batch moved bytes")


def backpressure_then_success(harness: EngineHarness) -> None:
    world = World.build(harness)
    harness.inject_backpressure(world.a, 2)
    for _ in range(2):
        status = world.run(TransferOp.READ, [0], [0], [REGION_BYTES])
        expect(status.state is TransferState.BACKPRESSURE, f"{status.state}, not BACKPRESSURE")
        expect(bool(status.message), "a backpressured status must say why")
        expect(not world.a_buf.any(), "a backpressured post must not move bytes")
    status = world.run(TransferOp.READ, [0], [0], [REGION_BYTES])
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.a_buf, world.b_buf)


def dead_peer_gives_a_sticky_terminal_failure(harness: EngineHarness) -> None:
    world = World.build(harness)
    remote = harness.dead_peer(world.a)
    world.a_buf[:] = 0
    handle = world.a.post(
        TransferOp.READ, world.a_region, remote, i64([0]), i64([0]), i64([BLOCK]), "doomed"
    )
    status = wait(harness, world.a, handle)
    expect(status.state is TransferState.FAILED, f"{status.state}, not FAILED")
    expect(status.state.is_terminal and bool(status.message), "a failure must say why")
    expect(world.a.poll(handle) == status, "a terminal failure must not change")
    world.a.release(handle)
    with raises(TransferEngineError):
        world.a.poll(handle)


def _hold(harness: EngineHarness, engine: TransferEngine) -> None:
    """Keep ``engine``'s new posts in flight, or skip the check (never pass it unrun)."""
    if not harness.hold_completion(engine, True):
        raise UnsupportedConditionError(
            f"{harness.kind or 'this engine'} cannot hold a completion: no in-flight batch to check"
        )


def remove_peer_fails_in_flight_work(harness: EngineHarness) -> None:
    world = World.build(harness)
    _hold(harness, world.a)
    in_flight = world.post(TransferOp.READ, [0], [0], [BLOCK])
    state = world.a.poll(in_flight).state
    expect(state is TransferState.IN_PROGRESS, f"a held transfer is {state}")
    world.a.remove_peer(world.peer_b)
    harness.hold_completion(world.a, False)
    final = world.a.poll(in_flight)
    expect(final.state is TransferState.FAILED, f"{final.state}, not FAILED after remove_peer")
    expect(world.peer_b in final.message, f"{final.message!r} does not name the peer")


def remove_peer_refuses_new_work_until_added_again(harness: EngineHarness) -> None:
    world = World.build(harness)
    finished = world.run(TransferOp.READ, [0], [0], [BLOCK])
    expect(finished.state is TransferState.SUCCEEDED, finished.message)
    world.a.remove_peer(world.peer_b)
    with raises(TransferEngineError):
        world.post(TransferOp.READ, [0], [0], [BLOCK])
    with raises(TransferEngineError):
        world.a.import_region(world.peer_b, world.b_region.descriptor)

    peer = world.a.add_peer(world.b.metadata())
    world.b_on_a = world.a.import_region(peer, world.b_region.descriptor)
    world.a_buf[:] = 0
    status = world.run(TransferOp.READ, [0], [0], [REGION_BYTES])
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.a_buf, world.b_buf)


def batches_to_a_removed_peer_settle(harness: EngineHarness) -> None:
    world = World.build(harness)
    _hold(harness, world.a)
    handle = world.post(TransferOp.READ, [0], [0], [BLOCK])
    world.a.remove_peer(world.peer_b)
    harness.hold_completion(world.a, False)
    for _ in range(MAX_POLLS):  # at once, or once the transport ended what it had posted
        if world.a.settled(handle):
            break
        world.a.poll(handle)
        harness.pump()
    expect(world.a.settled(handle), "a batch of a removed peer never settled")
    expect(world.a.poll(handle).state.is_terminal, "a settled batch must be terminal")
    world.a.release(handle)


OUT_OF_REGION = (
    (0, REGION_BYTES - BLOCK + 1, BLOCK),  # remote end one byte past the region
    (REGION_BYTES - 1, 0, 2),  # local end past the region
    (0, -BLOCK, BLOCK),  # negative remote offset
    (-1, 0, BLOCK),  # negative local offset
    (0, 0, 0),  # empty descriptor
    (0, 0, -BLOCK),  # negative size
    (0, 2**62, BLOCK),  # far outside
)


def out_of_region_descriptors_are_refused_before_any_byte_moves(harness: EngineHarness) -> None:
    world = World.build(harness)
    for lo, ro, size in OUT_OF_REGION:
        for op in (TransferOp.READ, TransferOp.WRITE):
            with raises(TransferEngineError, match="descriptor 1"):
                world.post(op, [0, lo], [0, ro], [BLOCK, size])
        expect(not world.a_buf.any(), f"descriptor {(lo, ro, size)} moved bytes")
        assert_equal(world.b_buf, pattern(1))


def mismatched_descriptor_arrays_are_rejected(harness: EngineHarness) -> None:
    world = World.build(harness)
    with raises(ValueError, match="differ in length"):
        world.post(TransferOp.READ, [0, BLOCK], [0], [BLOCK, BLOCK])


def unknown_regions_are_refused(harness: EngineHarness) -> None:
    world = World.build(harness)
    forged = RemoteRegion(world.peer_b, world.b_on_a.region_id + 1000, REGION_BYTES)
    with raises(TransferEngineError, match="not imported"):
        world.a.post(TransferOp.READ, world.a_region, forged, i64([0]), i64([0]), i64([1]), "t")
    world.a.deregister_region(world.a_region)
    with raises(TransferEngineError, match="not registered"):
        world.post(TransferOp.READ, [0], [0], [1])


def import_region_checks_the_owner(harness: EngineHarness) -> None:
    world = World.build(harness)
    c = harness.engine("c")
    peer_c = world.a.add_peer(c.metadata())
    with raises(TransferEngineError):
        world.a.import_region(peer_c, world.b_region.descriptor)


def add_peer_is_idempotent(harness: EngineHarness) -> None:
    world = World.build(harness)
    expect(world.a.add_peer(world.b.metadata()) == world.peer_b, "add_peer changed the peer id")
    expect(world.a.add_peer(world.b.metadata()) == world.peer_b, "add_peer changed the peer id")
    expect(world.peer_b == world.b.name, f"peer id {world.peer_b!r} is not {world.b.name!r}")


def release_forgets_the_handle(harness: EngineHarness) -> None:
    world = World.build(harness)
    handle = world.post(TransferOp.READ, [0], [0], [BLOCK])
    status = wait(harness, world.a, handle)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    world.a.release(handle)
    world.a.release(handle)
    with raises(TransferEngineError, match="unknown or released"):
        world.a.poll(handle)


def progress_never_blocks_and_keeps_transfers_moving(harness: EngineHarness) -> None:
    world = World.build(harness)
    handle = world.post(TransferOp.READ, [0], [0], [REGION_BYTES])
    for _ in range(3):
        world.a.progress()
        world.b.progress()
    status = wait(harness, world.a, handle)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.a_buf, world.b_buf)


def closed_engine_refuses_work(harness: EngineHarness) -> None:
    world = World.build(harness)
    world.a.close()
    world.a.close()
    with raises(TransferEngineError, match="closed"):
        world.post(TransferOp.READ, [0], [0], [BLOCK])
    with raises(TransferEngineError, match="closed"):
        world.a.progress()


def _checks(*runs: Callable[[EngineHarness], None]) -> tuple[Check, ...]:
    """One check per function, named after it."""
    return tuple(Check(run.__name__, run) for run in runs)


ENGINE_CHECKS: tuple[Check, ...] = (
    *_checks(
        register_region_describes_the_memory,
        host_regions_work_with_any_device_id,
        register_region_rejects_empty_memory,
        regions_in_one_allocation_move_their_own_bytes,
        read_copies_remote_bytes,
        write_copies_local_bytes,
    ),
    Check(
        "permuted_block_lists_move_exactly_the_named_blocks[read]",
        partial(permuted_block_lists_move_exactly_the_named_blocks, TransferOp.READ),
    ),
    Check(
        "permuted_block_lists_move_exactly_the_named_blocks[write]",
        partial(permuted_block_lists_move_exactly_the_named_blocks, TransferOp.WRITE),
    ),
    *_checks(
        byte_granular_descriptors,
        empty_batch_succeeds_without_moving_bytes,
        backpressure_then_success,
        dead_peer_gives_a_sticky_terminal_failure,
        remove_peer_fails_in_flight_work,
        remove_peer_refuses_new_work_until_added_again,
        finished_batches_are_settled,
        cancel_keeps_the_batch_known_until_it_settles,
        cancel_after_success_changes_nothing,
        batches_to_a_removed_peer_settle,
        out_of_region_descriptors_are_refused_before_any_byte_moves,
        mismatched_descriptor_arrays_are_rejected,
        unknown_regions_are_refused,
        import_region_checks_the_owner,
        add_peer_is_idempotent,
        release_forgets_the_handle,
        release_in_flight_forgets_the_batch_and_the_engine_goes_on,
        transfers_complete_while_only_the_initiator_drives_progress,
        progress_never_blocks_and_keeps_transfers_moving,
        closed_engine_refuses_work,
    ),
)
