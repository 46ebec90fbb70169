"""Persistent backpressure ends at the transfer deadline, on a fake clock and fake ports."""

from __future__ import annotations

import numpy as np

from moriio.domain.kv.planner import TransferPlan
from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.poster import Poster, PostRequest, PostResult
from moriio.ports import (
    LocalRegion,
    MemoryKind,
    PeerId,
    RemoteRegion,
    TransferHandle,
    TransferOp,
    TransferState,
    TransferStatus,
)
from moriio.testing.handoffs import signed_read
from moriio.testing.inmemory import FakeClock
from moriio.testing.stacks.stack import HOST, Timing
from support.worker_stacks import PRODUCER, worker_pair

TIMING = Timing()
FOREVER = 10**9  # posts that report BACKPRESSURE: the send queue never drains


class SpinGuard:
    """Fails a wait loop that sleeps on the fake clock far past every deadline."""

    def __init__(self, clock: FakeClock, limit: float) -> None:
        self._clock, self._limit = clock, limit
        clock.on_sleep = self

    def __call__(self) -> None:
        assert self._clock.now() < self._limit, "still waiting long after the transfer deadline"


def test_a_read_under_persistent_backpressure_fails_at_its_deadline() -> None:
    clock = FakeClock()
    producer, consumer, (p_memory, d_memory) = worker_pair(TransferMode.READ, clock, TIMING)
    p_memory.write(9, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    consumer.inner_engine.inject_backpressure(FOREVER)
    guard_limit = 20 * TIMING.transfer_timeout
    SpinGuard(clock, guard_limit)

    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    read = signed_read(ReadOrder("d-1", "tx-1", (1, 2), (3, 4), peer, None))
    consumer.service.start_step(StepOrders(reads=[read]), 0.0)
    for layer in d_memory.layer_names:
        consumer.service.wait_for_layer(layer)  # returns: the deadline ends the retries

    assert clock.now() < 2 * TIMING.transfer_timeout
    report = consumer.service.finish_step()
    assert report.invalid_block_ids == {1, 2}
    assert not d_memory.holds(9, (1, 2), 0)
    stats = consumer.service.ctx.poster.stats
    assert stats.backpressure_events > 1
    assert stats.timed_out == len(d_memory.layer_names)
    assert stats.succeeded == 0
    # The producer is still told: its blocks are released, not held until the lease ends.
    assert producer.service.finish_step().finished_sending == {"p-1"}


class SaturatedEngine:
    """A fake engine whose send queue never drains: every post reports BACKPRESSURE."""

    def __init__(self) -> None:
        self.posts = 0
        self.released: list[TransferHandle] = []

    def post(self, *_: object) -> TransferHandle:
        self.posts += 1
        return TransferHandle(self.posts)

    def poll(self, handle: TransferHandle) -> TransferStatus:
        return TransferStatus(TransferState.BACKPRESSURE, "send queue full")

    def release(self, handle: TransferHandle) -> None:
        self.released.append(handle)

    def progress(self) -> None:
        pass


def test_the_poster_gives_up_retrying_at_the_deadline() -> None:
    clock = FakeClock()
    engine = SaturatedEngine()
    policy = TransferPolicy(transfer_timeout=1.0, defer_timeout=2.0)
    poster = Poster(engine, clock, policy)  # type: ignore[arg-type]
    one = np.array([0], dtype=np.int64)
    plan = TransferPlan(one, one, np.array([8], dtype=np.int64))
    local = LocalRegion(0, 0, 8, MemoryKind.HOST, 0, b"")
    remote = RemoteRegion(PeerId("p"), 0, 8)
    poster.submit(PostRequest("t", "layer", TransferOp.READ, local, remote, plan))

    results: list[PostResult] = []
    while not results:
        assert clock.now() < 10 * policy.transfer_timeout, "backpressure retried forever"
        clock.advance(0.01)
        results = poster.progress()

    [result] = results
    assert not result.ok
    assert "deadline" in result.message
    assert result.retries > 1
    assert engine.posts == result.retries + 1
    assert sorted(engine.released) == [TransferHandle(i) for i in range(1, engine.posts + 1)]
    assert result.elapsed <= policy.transfer_timeout + 0.01
    assert poster.inflight("t") == 0
    assert poster.stats.timed_out == 1
