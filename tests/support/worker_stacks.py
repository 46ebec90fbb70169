"""A producer or consumer worker over the in-memory adapters, for service-layer unit tests."""

from __future__ import annotations

import random

from moriio.domain.wire.modes import TransferMode
from moriio.ports import Clock
from moriio.testing.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.testing.inmemory import InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import Endpoint, Stack, Timing, build_stack

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
