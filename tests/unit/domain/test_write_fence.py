"""The WRITE write-by lease: no write lands in consumer blocks that were given back.

Real in-memory workers (engine, channels, KV, services) on one fabric and one fake clock;
each host's wall clock may be skewed from it.
"""

from __future__ import annotations

import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import ExpectWriteOrder, HoldOrder, SaveOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.messages import RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import WorkerService
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
PRODUCER_PEER = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
# A skew allowance larger than the transfer timeout, so each bound is told apart; peers
# that are stepped by hand between long clock jumps are not judged by liveness.
TIMING = Timing(
    transfer_timeout=0.05,
    defer_timeout=0.1,
    clock_skew_allowance=0.1,
    quarantine_timeout=0.03,
    liveness_timeout=60.0,
)


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        self.rng = random.Random(3)

    def start(self, name: str, *, producer: bool, wall_offset: float = 0.0) -> Stack:
        return build_stack(
            name=name,
            mode=TransferMode.WRITE,
            is_producer=producer,
            endpoint=PRODUCER if producer else CONSUMER,
            memory=KVMemory(2, 16, 4),
            clock=self.clock,
            fabric=self.fabric,
            network=self.network,
            timing=TIMING,
            rng=self.rng,
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
            wall_offset=wall_offset,
        )


def _announce(consumer: Stack, write_by: float) -> RemoteBlocks:
    return RemoteBlocks(
        transfer_id="tx",
        request_id="d-1",
        block_ids=(4, 5),
        first_block=0,
        consumer_dp_rank=0,
        consumer_tp_rank=0,
        consumer_tp_size=1,
        reply_to=consumer.channel.address,
        consumer_instance_id=consumer.name,
        write_by=write_by,
        prompt=PROMPT,
    )


def _announced(consumer: Stack) -> RemoteBlocks:
    """The one announcement ``consumer`` sent."""
    sent = [s.message for s in consumer.inner_channel.sent]
    announced = [m for m in sent if isinstance(m, RemoteBlocks)]
    assert len(announced) == 1
    return announced[0]


def _forward(service: WorkerService, saves: list[SaveOrder]) -> None:
    service.start_step(StepOrders(saves=saves), 0.0)
    for layer in service.ctx.kv.names:
        service.save_layer(layer)
    service.end_forward()


def _verdicts(stack: Stack) -> list[WriteDone | WriteFailed]:
    sent = [s.message for s in stack.inner_channel.sent]
    return [m for m in sent if isinstance(m, WriteDone | WriteFailed)]


@pytest.mark.parametrize("saved_first", [False, True])
def test_an_announcement_past_its_write_by_lease_is_refused_unwritten(saved_first: bool) -> None:
    world = World()
    producer = world.start("producer#0", producer=True)
    consumer = world.start("consumer#0", producer=False)
    service = producer.service
    assert service.producer is not None
    save = SaveOrder("p-1", "tx", ((1, 2),), None, prompt=PROMPT)
    if saved_first:
        service.start_step(StepOrders(saves=[save]), 0.0)
    world.clock.advance(1.0)
    # Not yet passed on the producer's clock, but within the skew allowance of it.
    service.producer.on_remote_blocks(_announce(consumer, service.ctx.wall_now() + 0.05))
    _forward(service, [] if saved_first else [save])
    verdicts = _verdicts(producer)
    assert len(verdicts) == 1
    assert isinstance(verdicts[0], WriteFailed)
    assert "write-by" in verdicts[0].reason
    assert service.ctx.counters.late_announcements == 1
    assert service.ctx.poster.stats.posts == 0


def test_no_layer_is_posted_once_the_write_by_lease_passed() -> None:
    world = World()
    producer = world.start("producer#0", producer=True)
    consumer = world.start("consumer#0", producer=False)
    service = producer.service
    assert service.producer is not None
    service.start_step(
        StepOrders(saves=[SaveOrder("p-1", "tx", ((1, 2),), None, prompt=PROMPT)]), 0.0
    )
    service.producer.on_remote_blocks(_announce(consumer, service.ctx.wall_now() + 0.3))
    world.clock.advance(0.25)  # the forward runs late: within the allowance of the lease
    for layer in service.ctx.kv.names:
        service.save_layer(layer)
    service.end_forward()
    service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx")]), 0.0)
    assert service.finish_step().finished_sending == {"p-1"}  # the producer's blocks are free
    assert service.ctx.poster.stats.posts == 0
    verdicts = _verdicts(producer)
    assert [type(v) for v in verdicts] == [WriteFailed]


def test_writes_posted_before_the_lease_still_succeed() -> None:
    world = World()
    producer = world.start("producer#0", producer=True)
    consumer = world.start("consumer#0", producer=False)
    service = producer.service
    assert service.producer is not None
    service.start_step(
        StepOrders(saves=[SaveOrder("p-1", "tx", ((1, 2),), None, prompt=PROMPT)]), 0.0
    )
    service.producer.on_remote_blocks(_announce(consumer, service.ctx.wall_now() + 0.15))
    world.clock.advance(0.04)  # within the transfer timeout and before the lease less skew
    for layer in service.ctx.kv.names:
        service.save_layer(layer)
    service.end_forward()
    service.pump()
    assert service.ctx.poster.stats.posts == 2
    assert [type(v) for v in _verdicts(producer)] == [WriteDone]
    assert service.ctx.counters.late_announcements == 0


def test_the_consumer_fences_blocks_past_lease_transfer_quarantine_and_skew() -> None:
    world = World()
    world.start("producer#0", producer=True)
    consumer = world.start("consumer#0", producer=False, wall_offset=1000.0)
    service = consumer.service
    order = ExpectWriteOrder("d-1", "tx", (4, 5), 0, PRODUCER_PEER, prompt=PROMPT)
    service.start_step(StepOrders(expect_writes=[order]), service.ctx.wall_now())
    announced = [s.message for s in consumer.inner_channel.sent]
    assert len(announced) == 1
    assert isinstance(announced[0], RemoteBlocks)
    # On the consumer's wall clock (here 1000 s ahead of the monotonic one).
    assert announced[0].write_by == pytest.approx(1000.0 + TIMING.defer_timeout)
    fence = (
        TIMING.defer_timeout
        + TIMING.transfer_timeout
        + TIMING.quarantine_timeout
        + TIMING.clock_skew_allowance
    )
    world.clock.advance(fence - 0.001)
    report = service.finish_step()
    assert report.finished_recving == set()  # no verdict came: still fenced
    world.clock.advance(0.002)
    report = service.finish_step()
    assert report.finished_recving == {"d-1"}
    assert report.invalid_block_ids == {4, 5}
    counters = service.ctx.counters
    assert counters.quarantined_blocks == 2
    assert counters.late_completions == 0
    assert service.consumer is not None
    service.consumer.on_write_done(WriteDone("tx"))  # the producer's verdict, too late
    service.consumer.on_write_done(WriteDone("other"))  # never ours: not a late completion
    assert counters.late_completions == 1
    assert service.finish_step().finished_recving == set()


def test_a_verdict_ends_the_fence_at_once() -> None:
    world = World()
    world.start("producer#0", producer=True)
    consumer = world.start("consumer#0", producer=False)
    service = consumer.service
    order = ExpectWriteOrder("d-1", "tx", (4, 5), 0, PRODUCER_PEER, prompt=PROMPT)
    service.start_step(StepOrders(expect_writes=[order]), 0.0)
    assert service.consumer is not None
    token = _announced(consumer).token
    service.consumer.on_write_failed(WriteFailed("tx", "the write-by lease had passed", token))
    report = service.finish_step()
    assert report.finished_recving == {"d-1"}
    assert report.failed_recving == {"d-1"}
    assert service.ctx.counters.quarantined_blocks == 0
