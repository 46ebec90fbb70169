"""NIXL for real (two agents over loopback TCP): a timed-out READ hands its blocks back only
once NIXL reports the transfer DONE or ERR, even after its remote agent was removed.

UCX's TCP transport keeps a 32 MiB read in progress across several polls (CMA would copy it
inside ``post``). Neither freeing an active NIXL handle nor removing the remote agent stops
the bytes of what UCX already posted (the first test's control shows it).
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from moriio.adapters.chaos import EngineFaultPlan
from moriio.domain.worker.service import StepReport
from moriio.ports import TransferEngine, TransferOp
from moriio.testing.stacks.stack import Timing
from support.quarantine import LOCAL, ReadWorld, read_world

pytest.importorskip("nixl_cu12", reason="NIXL is not installed")

pytestmark = pytest.mark.integration

BLOCK_TOKENS = 1 << 19  # 4 MiB per block and K/V: 32 MiB in the one batch of both layers
BATCHES = 1  # one batch per read: both layers, between the two KV buffers (spans)


def _nixl(name: str) -> TransferEngine:
    from moriio.adapters.nixl import NixlTransferEngine

    return NixlTransferEngine(f"{name}-{uuid.uuid4().hex[:6]}", loopback=True)


@pytest.fixture(autouse=True)
def _tcp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UCX_TLS", "tcp")


def _world(timing: Timing, plan: EngineFaultPlan | None) -> ReadWorld:
    return read_world(_nixl, timing, consumer_plan=plan, block_size=BLOCK_TOKENS, num_blocks=5)


def _time_out(world: ReadWorld) -> None:
    world.start_read()
    assert world.step().finished_recving == set()
    world.step(world.timing.transfer_timeout + 0.001)
    assert world.consumer.service.ctx.poster.stats.timed_out == BATCHES


def _close(world: ReadWorld) -> None:
    for stack in (world.consumer, world.producer):
        stack.crash()


def test_a_timed_out_read_is_handed_back_after_nixl_reports_it_done() -> None:
    world = _world(Timing(transfer_timeout=0.05, quarantine_timeout=1e6), None)
    try:
        _time_out(world)
        assert world.stats.quarantined_blocks == len(LOCAL)
        report = _until_handed_back(world)
        assert report.failed_recving == {"d-1"}
        assert report.invalid_block_ids == set(LOCAL)
        assert world.loaded()  # the late completion landed before the hand-back
        assert world.stats.late_completions == BATCHES
        assert world.stats.peer_teardowns == 0
    finally:
        _close(world)


def _until_handed_back(world: ReadWorld) -> StepReport:
    report = world.step(0.001)
    for _ in range(20_000):  # NIXL moves the bytes while we poll
        if report.finished_recving:
            return report
        assert report.invalid_block_ids == set()
        report = world.step(0.001)
    raise AssertionError("the read was never handed back")


def test_a_read_that_outlives_its_quarantine_stays_fenced_until_nixl_ends_it() -> None:
    """At the quarantine limit the remote agent is removed, which does not stop what UCX
    already posted: the blocks wait for NIXL's verdict, then nothing of the read lands."""
    world = _world(Timing(transfer_timeout=0.05, quarantine_timeout=0.01), None)
    try:
        _time_out(world)
        assert world.stats.quarantined_blocks == len(LOCAL)
        report = world.step(0.011)  # the quarantine limit: NIXL removes the remote agent
        assert world.stats.peer_teardowns == 1
        if not report.finished_recving:
            report = _until_handed_back(world)
        assert report.finished_recving == {"d-1"}
        assert report.invalid_block_ids == set(LOCAL)
        handed_back = np.array(world.d_memory.buffer[:, :, list(LOCAL)])
        for _ in range(50):  # nothing of the read lands after the hand-back
            world.step(0.001)
        assert np.array_equal(world.d_memory.buffer[:, :, list(LOCAL)], handed_back)
    finally:
        _close(world)


def test_nixl_aborts_do_not_stop_the_bytes_of_a_posted_read() -> None:
    """Why the adapter never trusts them: freeing the active handle reports success, the
    remote agent is removed, and the whole read still lands."""
    from moriio.adapters.nixl import NixlTransferEngine
    from moriio.testing.contract.harness import i64

    a, b = _nixl("a"), _nixl("b")
    assert isinstance(a, NixlTransferEngine)
    size = 64 << 20
    mine, theirs = np.zeros(size, np.uint8), np.full(size, 7, np.uint8)
    try:
        local = a.register_region(mine.ctypes.data, size)
        remote = a.import_region(
            a.add_peer(b.metadata()), b.register_region(theirs.ctypes.data, size).descriptor
        )
        handle = a.post(TransferOp.READ, local, remote, i64([0]), i64([0]), i64([size]), "t")
        nixl_handle = a._xfers[handle].handle
        a._agent.release_xfer_handle(nixl_handle)
        a._xfers[handle].handle = None
        a._agent.remove_remote_agent(remote.peer)
        for _ in range(100_000):
            if (mine == 7).all():
                break
            a.progress()
            b.progress()
        assert (mine == 7).all()
    finally:
        a.close()
        b.close()
