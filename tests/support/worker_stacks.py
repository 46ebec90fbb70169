"""A producer or consumer worker over the in-memory adapters, for service-layer unit tests."""

from __future__ import annotations

import random

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import ExpectWriteOrder, HoldOrder, SaveOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.ports import Clock
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)


def worker_stack(
    name: str,
    producer: bool,
    mode: TransferMode,
    clock: Clock,
    fabric: InMemoryFabric,
    net: InMemoryNetwork,
    timing: Timing | None = None,
) -> tuple[Stack, KVMemory]:
    """One worker (2 layers, 16 blocks of 4 tokens) with no fault injected."""
    memory = KVMemory(2, 16, 4)
    stack = build_stack(
        name=name,
        mode=mode,
        is_producer=producer,
        endpoint=PRODUCER if producer else CONSUMER,
        memory=memory,
        clock=clock,
        fabric=fabric,
        network=net,
        timing=timing or Timing(),
        rng=random.Random(3),
        engine_plan=EngineFaultPlan(),
        channel_plan=ChannelFaultPlan(),
    )
    return stack, memory


def worker_pair(
    mode: TransferMode, clock: FakeClock, timing: Timing
) -> tuple[Stack, Stack, tuple[KVMemory, KVMemory]]:
    """A producer and a consumer on one in-memory fabric and network; last, their memories."""
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    producer, p_memory = worker_stack("producer#0", True, mode, clock, fabric, net, timing)
    consumer, d_memory = worker_stack("consumer#0", False, mode, clock, fabric, net, timing)
    return producer, consumer, (p_memory, d_memory)


def write_announced_to_an_idle_prefill(
    timing: Timing,
) -> tuple[Stack, Stack, tuple[KVMemory, KVMemory]]:
    """WRITE: the producer computed its KV and sealed the transfer, then its engine stopped
    stepping; only then did the consumer announce where the KV must go. The write is posted by
    the producer's next step (or its progress thread). Last: both memories, which the write
    copies between (keep them alive as long as the stacks)."""
    producer, consumer, (p_memory, d_memory) = worker_pair(TransferMode.WRITE, FakeClock(), timing)
    p_memory.write(7, (3, 4), 0)
    producer.service.start_step(
        StepOrders(saves=[SaveOrder("p-1", "tx-1", ((3, 4),), None, prompt=PROMPT)]), 0.0
    )
    for layer in p_memory.layer_names:
        producer.service.save_layer(layer)
    producer.service.end_forward()
    assert producer.service.finish_step().finished_sending == set()
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    assert producer.service.finish_step().finished_sending == set()
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    announce = ExpectWriteOrder("d-1", "tx-1", (1, 2), 0, peer, prompt=PROMPT)
    consumer.service.start_step(StepOrders(expect_writes=[announce]), 0.0)
    return producer, consumer, (p_memory, d_memory)
