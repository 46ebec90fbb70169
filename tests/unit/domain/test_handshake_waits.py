"""Reads wait for their producer's handshake off the read path, and a dead peer is remembered.

Real in-memory workers; the handshake runs inline (the fake clock only moves when told), so
what a background handshake would do is observed at the next step, deterministically.
"""

from __future__ import annotations

import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.handshake_waits import HandshakeWaits
from moriio.domain.worker.peer_checks import PeerUnavailableError
from moriio.domain.worker.peers import MAX_PENDING_HANDSHAKES
from moriio.ports import PeerAddress
from moriio.testing.handoffs import signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
DEAD_PORT = 7500  # nothing listens there


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)

    def start(self, name: str, *, producer: bool) -> tuple[Stack, KVMemory]:
        memory = KVMemory(2, 16, 4)
        stack = build_stack(
            name=name,
            mode=TransferMode.READ,
            is_producer=producer,
            endpoint=PRODUCER if producer else CONSUMER,
            memory=memory,
            clock=self.clock,
            fabric=self.fabric,
            network=self.network,
            timing=Timing(),
            rng=random.Random(5),
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
        )
        return stack, memory


def _read(tid: str, port: int, *, load_async: bool) -> ReadOrder:
    peer = PeerEndpoint(HOST, port, PRODUCER.notify_port, 1)
    return signed_read(ReadOrder(f"d-{tid}", tid, (1, 2), (3, 4), peer, None, "", load_async))


@pytest.fixture
def world() -> World:
    return World()


def test_an_async_read_to_a_dead_peer_fails_on_its_own_and_is_reported_finished(
    world: World,
) -> None:
    consumer, _ = world.start("consumer#0", producer=False)
    service = consumer.service
    service.start_step(StepOrders(reads=[_read("tx-1", DEAD_PORT, load_async=True)]), 100.0)
    report = service.finish_step()
    assert report.finished_recving == {"d-tx-1"}
    assert report.failed_recving == {"d-tx-1"}
    assert report.invalid_block_ids == {1, 2}
    assert service.num_live == 0
    # Remembered: the next read to it fails without asking again.
    asked = len(consumer.inner_channel.requests)
    service.start_step(StepOrders(reads=[_read("tx-2", DEAD_PORT, load_async=True)]), 100.0)
    report = service.finish_step()
    assert report.failed_recving == {"d-tx-2"}
    assert len(consumer.inner_channel.requests) == asked
    assert service.ctx.peers.handshake_failures == 1


def test_an_async_read_is_reported_finished_only_once_it_landed(world: World) -> None:
    world.start("producer#0", producer=True)
    consumer, memory = world.start("consumer#0", producer=False)
    service = consumer.service
    order = _read("tx-1", PRODUCER.handshake_port, load_async=True)
    service.start_step(StepOrders(reads=[order]), 100.0)
    for layer in memory.layer_names:
        service.wait_for_layer(layer)  # never waits on an asynchronous read
    reported: set[str] = set()
    for _ in range(100):
        report = service.finish_step()
        assert not report.invalid_block_ids
        reported |= report.finished_recving
        if reported:
            break
    assert reported == {"d-tx-1"}
    assert service.num_live == 0


def test_a_layerwise_read_to_a_dead_peer_is_a_load_error_of_this_step(world: World) -> None:
    consumer, _ = world.start("consumer#0", producer=False)
    service = consumer.service
    service.start_step(StepOrders(reads=[_read("tx-1", DEAD_PORT, load_async=False)]), 100.0)
    assert not service.consumer.has_live_reads()  # type: ignore[union-attr]
    report = service.finish_step()
    assert report.invalid_block_ids == {1, 2}
    assert not report.finished_recving  # the request ran in this step: nothing to wake


def test_pending_handshakes_are_capped(world: World) -> None:
    consumer, _ = world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    for port in range(MAX_PENDING_HANDSHAKES):
        peers.begin_handshake(PeerAddress(HOST, 20000 + port))
    peers.begin_handshake(PeerAddress(HOST, 20000))  # already pending: no new one
    with pytest.raises(PeerUnavailableError, match="pending already"):
        peers.begin_handshake(PeerAddress(HOST, 30000))
    settled = peers.settle_handshakes()
    assert len(settled) == MAX_PENDING_HANDSHAKES
    assert peers.num_pending_handshakes == 0


def test_parked_items_expire_by_their_deadline_and_are_taken_by_address() -> None:
    waits: HandshakeWaits[str] = HandshakeWaits()
    a, b = PeerAddress(HOST, 1), PeerAddress(HOST, 2)
    waits.park("t1", a, "one", deadline=10.0)
    waits.park("t2", a, "two", deadline=30.0)
    waits.park("t3", b, "three", deadline=20.0)
    with pytest.raises(ValueError, match="t1"):
        waits.park("t1", b, "again", deadline=5.0)
    assert waits.expire(15.0) == ["one"]
    assert waits.take(a) == ["two"]
    assert "t3" in waits
    assert len(waits) == 1
    assert waits.expire(25.0) == ["three"]
    assert len(waits) == 0
    assert waits.take(b) == []
