"""Sleep mode in the domain: a worker retires its registration, its peers confirm, it registers
again at other addresses under the next generation, and transfers of the retired generation
are refused by name.

Real in-memory workers (engine, channels, KV, services) on one fabric and a fake clock.
"""

from __future__ import annotations

import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import (
    ExpectWriteOrder,
    HoldOrder,
    ReadOrder,
    SaveOrder,
    StepOrders,
)
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.messages import Retired, RetiredAck, WriteFailed
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.kv_registry import LocalKV
from moriio.domain.worker.peer_checks import PeerGenerationError, PeerUnavailableError
from moriio.ports import Inbound, PeerAddress
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
HANDSHAKE = PeerAddress(HOST, PRODUCER.handshake_port)
BLOCKS = 16


class World:
    """One fabric, network and fake clock joining a producer and a consumer worker."""

    def __init__(self, mode: TransferMode) -> None:
        self.mode = mode
        self.clock = FakeClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        self.rng = random.Random(7)

    def start(self, name: str, *, producer: bool) -> tuple[Stack, KVMemory]:
        memory = KVMemory(2, BLOCKS, 4)
        stack = build_stack(
            name=name,
            mode=self.mode,
            is_producer=producer,
            endpoint=PRODUCER if producer else CONSUMER,
            memory=memory,
            clock=self.clock,
            fabric=self.fabric,
            network=self.network,
            timing=Timing(handshake_timeout=5.0),  # a responder slowed by a busy machine
            rng=self.rng,
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
        )
        return stack, memory


def _read(
    tid: str, local: tuple[int, ...], remote: tuple[int, ...], generation: int | None
) -> ReadOrder:
    peer = PeerEndpoint(
        HOST,
        PRODUCER.handshake_port,
        PRODUCER.notify_port,
        1,
        instance_id="producer#0",
        generation=generation,
    )
    return signed_read(ReadOrder(f"d-{tid}", tid, local, remote, peer, None))


def _read_now(consumer: Stack, memory: KVMemory, order: ReadOrder) -> set[int]:
    service = consumer.service
    service.start_step(StepOrders(reads=[order]), 0.0)
    for layer in memory.layer_names:
        service.wait_for_layer(layer)
    return service.finish_step().invalid_block_ids


def _sent(stack: Stack, kind: type) -> list[object]:
    return [s.message for s in stack.inner_channel.sent if isinstance(s.message, kind)]


def _wake(stack: Stack) -> KVMemory:
    """The KV memory allocated again (a new buffer, so other addresses), registered anew."""
    memory = KVMemory(2, BLOCKS, 4)
    stack.service.wake(LocalKV.register(stack.engine, memory.tensors()))
    return memory


def test_a_producer_retires_waits_for_its_reader_and_serves_the_next_generation() -> None:
    world = World(TransferMode.READ)
    producer, p_memory = world.start("producer#0", producer=True)
    consumer, d_memory = world.start("consumer#0", producer=False)
    p_memory.write(5, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    assert _read_now(consumer, d_memory, _read("tx-1", (1, 2), (3, 4), 1)) == set()
    assert d_memory.holds(5, (1, 2), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-2", "tx-2")]), 0.0)

    producer.service.retire()
    sleep = producer.service.sleep
    assert not sleep.drained()  # the reader has not confirmed yet
    assert sleep.unconfirmed == (consumer.channel.address,)
    [notice] = _sent(producer, Retired)
    assert notice == Retired("producer#0", 1, producer.channel.address)
    # The hold nobody read is given up: its blocks are reported free.
    assert producer.service.finish_step().finished_sending == {"p-1", "p-2"}

    consumer.service.pump()  # takes the notice, drops its connection, confirms
    assert _sent(consumer, RetiredAck) == [RetiredAck("producer#0", 1, consumer.channel.address)]
    assert consumer.service.ctx.peers.connected(HANDSHAKE) is None
    producer.service.pump()
    assert sleep.drained()

    peers = consumer.service.ctx.peers
    with pytest.raises(PeerGenerationError, match="retired registration generation 1"):
        peers.connect(HANDSHAKE, "producer#0", 1)
    with pytest.raises(PeerUnavailableError, match="asleep: registration generation 1"):
        peers.connect(HANDSHAKE, "producer#0", 2)  # a handshake while it sleeps

    new_memory = _wake(producer)
    assert producer.service.ctx.peers.generation == 2
    new_memory.write(6, (7, 8), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-3", "tx-3")]), 0.0)
    assert _read_now(consumer, d_memory, _read("tx-3", (9, 10), (7, 8), 2)) == set()
    assert d_memory.holds(6, (9, 10), 0)  # read from the memory registered at the wake

    invalid = _read_now(consumer, d_memory, _read("tx-old", (11, 12), (3, 4), 1))
    assert invalid == {11, 12}
    assert d_memory.dirty_blocks((11, 12)) == []
    assert consumer.service.ctx.counters.failures_by_kind == {"retired_generation": 1}
    with pytest.raises(PeerGenerationError, match="does not name the generation"):
        peers.connect(HANDSHAKE, "producer#0", None)


def test_a_sleeping_consumer_gets_no_write_after_its_producer_confirmed() -> None:
    world = World(TransferMode.WRITE)
    producer, p_memory = world.start("producer#0", producer=True)
    consumer, d_memory = world.start("consumer#0", producer=False)
    endpoint = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)

    def push(tid: str, uid: int, local: tuple[int, ...], remote: tuple[int, ...]) -> None:
        p_memory.write(uid, remote, 0)
        consumer.service.start_step(
            StepOrders(
                expect_writes=[ExpectWriteOrder(f"d-{tid}", tid, local, 0, endpoint, prompt=PROMPT)]
            ),
            0.0,
        )
        producer.service.start_step(
            StepOrders(saves=[SaveOrder(f"p-{tid}", tid, (remote,), None, prompt=PROMPT)]), 0.0
        )
        producer.service.pump()  # the announcement arrives, the producer handshakes

    push("tx-1", 5, (1, 2), (3, 4))
    for layer in p_memory.layer_names:
        producer.service.save_layer(layer)
    producer.service.end_forward()
    producer.service.pump()
    consumer.service.pump()
    assert consumer.service.finish_step().finished_recving == {"d-tx-1"}
    assert d_memory.holds(5, (1, 2), 0)

    push("tx-2", 6, (5, 6), (7, 8))  # announced, the forward not run yet
    consumer.service.retire()
    producer.service.pump()  # the notice: its push fails, it confirms
    assert [m.transfer_id for m in _sent(producer, WriteFailed)] == ["tx-2"]  # type: ignore[attr-defined]
    consumer.service.pump()
    assert consumer.service.sleep.drained()
    old = d_memory.buffer.copy()
    consumer.service.ctx.kv.deregister(consumer.engine)  # released

    for layer in p_memory.layer_names:  # the producer's forward runs after all
        producer.service.save_layer(layer)
    producer.service.end_forward()
    producer.service.pump()
    assert (d_memory.buffer == old).all()  # nothing landed in the released memory

    new_memory = _wake(consumer)
    push("tx-3", 7, (9, 10), (11, 12))
    for layer in p_memory.layer_names:
        producer.service.save_layer(layer)
    producer.service.end_forward()
    producer.service.pump()
    consumer.service.pump()
    assert "d-tx-3" in consumer.service.finish_step().finished_recving
    assert new_memory.holds(7, (9, 10), 0)  # written into the memory registered at the wake
    assert (d_memory.buffer == old).all()
    assert producer.service.ctx.peers.connected(consumer.channel.address).generation == 2  # type: ignore[union-attr]


def test_posts_are_refused_from_the_retirement_and_allowed_after_the_wake() -> None:
    world = World(TransferMode.READ)
    producer, p_memory = world.start("producer#0", producer=True)
    consumer, d_memory = world.start("consumer#0", producer=False)
    consumer.service.ctx.peers.connect(HANDSHAKE, "producer#0", 1)
    consumer.service.retire()
    invalid = _read_now(consumer, d_memory, _read("tx-1", (1, 2), (3, 4), 1))
    assert invalid == {1, 2}  # refused: the consumer's own memory is being released
    assert d_memory.dirty_blocks((1, 2)) == []
    assert consumer.service.ctx.poster.stats.refused >= 1
    assert consumer.service.sleep.drained()  # no peer holds a consumer's regions in READ

    new_memory = _wake(consumer)
    p_memory.write(4, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-2", "tx-2")]), 0.0)
    assert _read_now(consumer, new_memory, _read("tx-2", (1, 2), (3, 4), 1)) == set()
    assert new_memory.holds(4, (1, 2), 0)


def test_an_acknowledgement_of_another_generation_or_instance_counts_for_nothing() -> None:
    world = World(TransferMode.READ)
    producer, _ = world.start("producer#0", producer=True)
    consumer, _ = world.start("consumer#0", producer=False)
    consumer.service.ctx.peers.connect(HANDSHAKE, "producer#0", 1)
    producer.service.retire()
    me = consumer.channel.address
    for ack in (RetiredAck("producer#0", 2, me), RetiredAck("someone", 1, me)):
        producer.service.dispatch([_inbound(ack)])
    assert producer.service.sleep.unconfirmed == (me,)
    producer.service.dispatch([_inbound(RetiredAck("producer#0", 1, me))])
    assert producer.service.sleep.drained()


def _inbound(message: RetiredAck) -> Inbound[RetiredAck]:
    return Inbound(message, PeerAddress(HOST, CONSUMER.notify_port))
