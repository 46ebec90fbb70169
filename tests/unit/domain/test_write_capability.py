"""WRITE capabilities: the consumer mints one per transfer in ``remote_blocks``; only
verdicts (and releases) that carry it count, and a transfer stays bound to its first
announcement. Real in-memory workers on one fabric and one fake clock.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import ExpectWriteOrder, HoldOrder, SaveOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.messages import Release, RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.values.capability import is_token
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
PRODUCER_PEER = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
TIMING = Timing(transfer_timeout=0.5, defer_timeout=1.0)
FORGED = "f" * 32


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        self.rng = random.Random(5)
        self.memory = {"producer": KVMemory(2, 16, 4), "consumer": KVMemory(2, 16, 4)}

    def start(self, name: str) -> Stack:
        producer = name == "producer"
        return build_stack(
            name=name,
            mode=TransferMode.WRITE,
            is_producer=producer,
            endpoint=PRODUCER if producer else CONSUMER,
            memory=self.memory[name],
            clock=self.clock,
            fabric=self.fabric,
            network=self.network,
            timing=TIMING,
            rng=self.rng,
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
        )


def _sent(stack: Stack, kind: type[object]) -> list[object]:
    return [s.message for s in stack.inner_channel.sent if isinstance(s.message, kind)]


def _expect(consumer: Stack) -> RemoteBlocks:
    order = ExpectWriteOrder("d-1", "tx", (4, 5), 0, PRODUCER_PEER, prompt=PROMPT)
    consumer.service.start_step(StepOrders(expect_writes=[order]), 0.0)
    (announced,) = _sent(consumer, RemoteBlocks)
    assert isinstance(announced, RemoteBlocks)
    return announced


def test_each_announcement_mints_a_fresh_capability() -> None:
    world = World()
    consumer = world.start("consumer")
    first = _expect(consumer)
    order = ExpectWriteOrder("d-2", "tx-2", (6,), 0, PRODUCER_PEER, prompt=PROMPT)
    consumer.service.start_step(StepOrders(expect_writes=[order]), 0.0)
    second = _sent(consumer, RemoteBlocks)[1]
    assert isinstance(second, RemoteBlocks)
    assert is_token(first.token)
    assert is_token(second.token)
    assert first.token != second.token


@pytest.mark.parametrize("verdict", ["done", "failed"])
@pytest.mark.parametrize("token", ["", FORGED])
def test_a_forged_verdict_neither_completes_nor_fails_the_load(verdict: str, token: str) -> None:
    world = World()
    consumer = world.start("consumer")
    announced = _expect(consumer)
    service = consumer.service
    assert service.consumer is not None
    if verdict == "done":
        service.consumer.on_write_done(WriteDone("tx", token))
    else:
        service.consumer.on_write_failed(WriteFailed("tx", "forged", token))
    report = service.finish_step()
    assert report.finished_recving == set()  # the blocks stay fenced
    assert service.ctx.counters.verdicts_refused == 1
    service.consumer.on_write_done(WriteDone("tx", announced.token))  # the genuine verdict
    report = service.finish_step()
    assert report.finished_recving == {"d-1"}
    assert report.failed_recving == set()


def test_the_producer_echoes_the_capability_and_the_bytes_land() -> None:
    world = World()
    producer, consumer = world.start("producer"), world.start("consumer")
    announced = _expect(consumer)
    world.memory["producer"].write(7, (1, 2), 0)  # the prefill's KV
    pusher = producer.service
    pusher.start_step(
        StepOrders(saves=[SaveOrder("p-1", "tx", ((1, 2),), None, prompt=PROMPT)]), 0.0
    )
    for layer in pusher.ctx.kv.names:
        pusher.save_layer(layer)
    pusher.end_forward()
    for _ in range(50):
        pusher.pump()
        consumer.service.pump()
        if _sent(producer, WriteDone):
            break
        world.clock.advance(0.001)
    (done,) = _sent(producer, WriteDone)
    assert isinstance(done, WriteDone)
    assert done.token == announced.token
    consumer.service.pump()
    assert consumer.service.finish_step().finished_recving == {"d-1"}
    assert world.memory["consumer"].holds(7, (4, 5), 0)


@pytest.mark.parametrize("saved_first", [True, False])
def test_a_second_announcement_with_another_capability_is_refused(saved_first: bool) -> None:
    world = World()
    producer, consumer = world.start("producer"), world.start("consumer")
    announced = _expect(consumer)
    world.memory["producer"].write(7, (1, 2), 0)
    pusher = producer.service
    assert pusher.producer is not None
    save = StepOrders(saves=[SaveOrder("p-1", "tx", ((1, 2),), None, prompt=PROMPT)])
    if saved_first:
        pusher.start_step(save, 0.0)
    pusher.producer.on_remote_blocks(announced)
    forged = dataclasses.replace(announced, block_ids=(9, 10), token=FORGED)
    pusher.producer.on_remote_blocks(forged)
    pusher.producer.on_remote_blocks(announced)  # a replay of the bound one: ignored
    if not saved_first:
        pusher.start_step(save, 0.0)
    counters = pusher.ctx.counters
    assert counters.announcements_refused == 1
    for layer in pusher.ctx.kv.names:
        pusher.save_layer(layer)
    pusher.end_forward()
    for _ in range(50):
        pusher.pump()
        if _sent(producer, WriteDone):
            break
        world.clock.advance(0.001)
    (done,) = _sent(producer, WriteDone)
    assert isinstance(done, WriteDone)
    assert done.token == announced.token
    assert world.memory["consumer"].holds(7, (4, 5), 0)
    assert world.memory["consumer"].dirty_blocks((9, 10)) == []  # never written


def test_a_release_without_the_bound_capability_does_not_cancel_the_push() -> None:
    world = World()
    producer, consumer = world.start("producer"), world.start("consumer")
    announced = _expect(consumer)
    pusher = producer.service
    assert pusher.producer is not None
    pusher.producer.on_remote_blocks(announced)  # before its save: buffered, bound
    pusher.producer.on_release(Release("tx", 1, 0, FORGED))
    assert pusher.ctx.counters.releases_refused == 1
    pusher.start_step(
        StepOrders(saves=[SaveOrder("p-1", "tx", ((1, 2),), None, prompt=PROMPT)]), 0.0
    )
    pusher.end_forward()
    pusher.start_step(StepOrders(holds=[HoldOrder("p-1", "tx")]), 0.0)
    assert pusher.ctx.poster.stats.posts == 1  # both layers written (one batch) all the same
    pusher.producer.on_release(Release("tx", 1, 0, announced.token))
    assert pusher.ctx.counters.releases_refused == 1
