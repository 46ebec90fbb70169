"""The contract's promises about settling and progress: a batch that ended is settled, a
cancelled one (best effort) stays known until it settles: its bytes may still land until
then, so no caller may reuse its memory before; a released one is forgotten (its bytes may
still land); and a target that steps rarely does not stall its peers."""

from __future__ import annotations

import time

import numpy as np

from moriio.ports import TransferEngineError, TransferOp, TransferState
from moriio.testing.contract.harness import (
    BLOCK,
    MAX_POLLS,
    NUM_BLOCKS,
    REGION_BYTES,
    EngineHarness,
    UnsupportedConditionError,
    World,
    expect,
    i64,
    pattern,
    raises,
    wait,
)

assert_equal = np.testing.assert_array_equal
# How long a 64 KiB transfer may take with only its initiator driving it: milliseconds on
# loopback, the rest slack for a loaded machine.
ALONE_S = 5.0


def finished_batches_are_settled(harness: EngineHarness) -> None:
    world = World.build(harness)
    handle = world.post(TransferOp.READ, [0], [0], [BLOCK])
    status = wait(harness, world.a, handle)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    expect(world.a.settled(handle), "a succeeded batch must be settled")
    world.a.release(handle)


def cancel_keeps_the_batch_known_until_it_settles(harness: EngineHarness) -> None:
    """A cancelled batch stays known and ends: failed with no promise about its bytes, or
    succeeded with every byte moved; either way it settles and the engine goes on."""
    world = World.build(harness)
    ids = list(range(NUM_BLOCKS))
    handle = world.post(TransferOp.READ, i64(ids) * BLOCK, i64(ids) * BLOCK, [BLOCK] * NUM_BLOCKS)
    world.a.cancel(handle)
    world.a.cancel(handle)  # twice: still best effort, never an error
    status = wait(harness, world.a, handle)
    expect(status.state in (TransferState.SUCCEEDED, TransferState.FAILED), str(status))
    if status.state is TransferState.SUCCEEDED:
        assert_equal(world.a_buf, world.b_buf)
    for _ in range(MAX_POLLS):
        if world.a.settled(handle):
            break
        harness.pump()
    expect(world.a.settled(handle), "a cancelled batch that ended never settled")
    world.a.release(handle)
    world.b_buf[:] = pattern(3)
    status = world.run(TransferOp.READ, [0], [0], [BLOCK])
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.a_buf[:BLOCK], world.b_buf[:BLOCK])


def cancel_after_success_changes_nothing(harness: EngineHarness) -> None:
    world = World.build(harness)
    handle = world.post(TransferOp.READ, [0], [0], [BLOCK])
    status = wait(harness, world.a, handle)
    expect(status.state is TransferState.SUCCEEDED, status.message)
    world.a.cancel(handle)
    expect(world.a.poll(handle).state is TransferState.SUCCEEDED, "cancel undid a success")
    expect(world.a.settled(handle), "a succeeded batch must stay settled")
    assert_equal(world.a_buf[:BLOCK], world.b_buf[:BLOCK])
    world.a.release(handle)


def release_in_flight_forgets_the_batch_and_the_engine_goes_on(harness: EngineHarness) -> None:
    """Releasing a batch still in progress forgets its handle at once; its bytes may still
    land (only the source's bytes, never others), so its memory is not reused here, and the
    engine keeps serving new batches."""
    world = World.build(harness)
    first_half = list(range(NUM_BLOCKS // 2))
    handle = world.post(
        TransferOp.READ, i64(first_half) * BLOCK, i64(first_half) * BLOCK, [BLOCK] * len(first_half)
    )
    world.a.release(handle)
    with raises(TransferEngineError, match="unknown or released"):
        world.a.poll(handle)
    last = (NUM_BLOCKS - 1) * BLOCK
    status = world.run(TransferOp.READ, [last], [last], [BLOCK])
    expect(status.state is TransferState.SUCCEEDED, status.message)
    assert_equal(world.a_buf[last:], world.b_buf[last:])
    for _ in range(10):
        harness.pump()
    head = slice(0, len(first_half) * BLOCK)
    landed_or_untouched = (world.a_buf[head] == 0) | (world.a_buf[head] == world.b_buf[head])
    expect(bool(landed_or_untouched.all()), "a released batch wrote bytes of no source")


def transfers_complete_while_only_the_initiator_drives_progress(harness: EngineHarness) -> None:
    """A READ and a WRITE end with only the initiator calling progress and poll: a target
    that steps rarely (an idle engine) must not stall its peers' transfers."""
    if harness.target_needs_progress:
        raise UnsupportedConditionError(f"{harness.kind}: {harness.target_needs_progress}")
    world = World.build(harness)
    for op, seed in ((TransferOp.READ, 1), (TransferOp.WRITE, 5)):
        world.a_buf[:] = pattern(seed) if op is TransferOp.WRITE else 0
        handle = world.post(op, [0], [0], [REGION_BYTES])
        deadline = time.monotonic() + ALONE_S
        while time.monotonic() < deadline:
            world.a.progress()
            if world.a.poll(handle).state is not TransferState.IN_PROGRESS:
                break
            time.sleep(0.0005)
        status = world.a.poll(handle)
        expect(
            status.state is TransferState.SUCCEEDED, f"{op.name} without target progress: {status}"
        )
        assert_equal(world.a_buf, world.b_buf)
        world.a.release(handle)
