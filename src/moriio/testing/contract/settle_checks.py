"""The contract's promises about settling: a batch that ended is settled, and a cancelled one
(best effort) stays known until it settles: its bytes may still land until then, so no
caller may reuse its memory before."""

from __future__ import annotations

import numpy as np

from moriio.ports import TransferOp, TransferState
from moriio.testing.contract.harness import (
    BLOCK,
    MAX_POLLS,
    NUM_BLOCKS,
    EngineHarness,
    World,
    expect,
    i64,
    pattern,
    wait,
)

assert_equal = np.testing.assert_array_equal


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
