"""A timed-out READ hands its blocks back only once no byte of it can land any more.

In-memory engines (late completion on demand, lost cancels, statuses stuck after a
teardown) and mori's stand-in (completions held back, no cancel). The blocks are handed
back (load error, finished_recving) when the engine reports the batch settled, or, for
engines whose teardown stops the transfer, once the peer was torn down.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType

from moriio.adapters.mori import MoriTransferEngine
from moriio.ports import TransferEngine
from moriio.testing.inmemory import InMemoryTransferEngine
from moriio.testing.stacks.stack import Timing
from support.quarantine import LOCAL, ReadWorld, read_world

# The world is stepped by 0.1 s: a liveness bound shorter than that would end the reads.
TIMING = Timing(
    transfer_timeout=0.05, defer_timeout=1.0, quarantine_timeout=1.0, liveness_timeout=60.0
)
BATCHES = 1  # one batch per read: every layer, between the two KV buffers (spans)


def _timed_out(world: ReadWorld, posted: Callable[[], object] | None = None) -> None:
    """Start the read and let its transfer timeout pass with the batches still in flight
    (``posted`` waits until the engine posted them)."""
    world.start_read()
    assert world.step().finished_recving == set()
    if posted is not None:
        posted()
    world.step(TIMING.transfer_timeout + 0.001)
    assert world.consumer.service.ctx.poster.stats.timed_out == BATCHES


def _not_handed_back(world: ReadWorld) -> None:
    for report in world.reports:
        assert "d-1" not in report.finished_recving
        assert report.invalid_block_ids == set()


def _handed_back_as_load_error(report_ids: set[str], invalid: set[int]) -> None:
    assert report_ids == {"d-1"}
    assert invalid == set(LOCAL)


def _inmemory(world: ReadWorld) -> InMemoryTransferEngine:
    inner = world.consumer.inner_engine
    assert isinstance(inner, InMemoryTransferEngine)
    return inner


def test_inmemory_a_late_completion_lands_before_the_blocks_are_handed_back() -> None:
    world = read_world(None, TIMING)
    engine = _inmemory(world)
    engine.hang, engine.cancels_stop_batches = True, False  # the cancel is lost
    _timed_out(world)
    for _ in range(5):  # within the quarantine: the batches may still land
        world.step(0.1)
    _not_handed_back(world)
    assert world.stats.quarantined_blocks == len(LOCAL)
    assert world.untouched()
    assert engine.land_hung() == BATCHES  # the DMA completes after its timeout
    report = world.step()
    _handed_back_as_load_error(report.failed_recving, report.invalid_block_ids)
    assert world.loaded()  # landed before the hand-back: nothing lands after it
    assert world.stats.late_completions == BATCHES
    assert world.stats.peer_teardowns == 0


def test_inmemory_a_cancelled_read_hands_its_blocks_back_at_once() -> None:
    """Control: a cancel that stops the batch leaves nothing to quarantine."""
    world = read_world(None, TIMING)
    engine = _inmemory(world)
    engine.hang, engine.cancels_stop_batches = True, True
    world.start_read()
    world.step()
    report = world.step(TIMING.transfer_timeout + 0.001)
    _handed_back_as_load_error(report.failed_recving, report.invalid_block_ids)
    assert len(engine.cancelled) == BATCHES
    assert world.stats.quarantined_blocks == 0
    assert world.untouched()


def test_inmemory_a_read_that_never_settles_is_torn_down_then_handed_back() -> None:
    world = read_world(None, TIMING)
    engine = _inmemory(world)
    engine.hang, engine.stuck_after_remove = True, True
    engine.cancels_stop_batches = False  # the cancel is lost
    _timed_out(world)
    world.step(TIMING.quarantine_timeout / 2)
    _not_handed_back(world)
    report = world.step(TIMING.quarantine_timeout / 2)  # the quarantine limit passed
    _handed_back_as_load_error(report.failed_recving, report.invalid_block_ids)
    assert world.stats.peer_teardowns == 1
    assert world.stats.quarantined_blocks == len(LOCAL)
    assert world.stats.late_completions == 0
    assert engine.land_hung() == 0  # the torn-down batches never move a byte
    assert world.untouched()
    # The connection is rebuilt for the next read, which loads.
    engine.hang = False
    handshakes = world.stats.handshakes
    world.start_read("d-2", "tx-2")
    report = world.step()
    assert report.finished_recving == {"d-2"}
    assert report.invalid_block_ids == set()
    assert world.stats.handshakes == handshakes + 1
    assert world.loaded()


def test_mori_a_held_completion_keeps_the_blocks_until_mori_reports_it(
    mori_stand_in: ModuleType,
) -> None:
    def mori(name: str) -> TransferEngine:
        return MoriTransferEngine(name, host="127.0.0.1", port=0)

    try:
        world = read_world(mori, TIMING)
        engine = world.consumer.inner_engine
        assert isinstance(engine, MoriTransferEngine)
        control = mori_stand_in.control(engine.name)
        control.hold = True  # the completion queue is not drained: the WRs stay posted
        _timed_out(world, lambda: engine.wait_for_connections(5))
        for _ in range(5):
            world.step(0.1)
        _not_handed_back(world)  # mori cannot cancel: the blocks wait
        assert world.stats.quarantined_blocks == len(LOCAL)
        world.step(TIMING.quarantine_timeout)  # the limit: the peer is removed...
        assert world.stats.peer_teardowns == 1
        _not_handed_back(world)  # ...but mori's posted work may still land: still fenced
        assert world.untouched()
        control.hold = False  # the queue pair completes the reads, late (mori's own thread)
        deadline = time.monotonic() + 5
        while not (report := world.step()).finished_recving:
            assert time.monotonic() < deadline, "the late completions never came"
            time.sleep(0.001)
        _handed_back_as_load_error(report.failed_recving, report.invalid_block_ids)
        assert world.loaded()  # landed before the hand-back
        assert world.stats.late_completions == BATCHES
    finally:
        mori_stand_in.reset()
