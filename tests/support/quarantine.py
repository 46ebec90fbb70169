"""A producer and a consumer worker over any engine, for the READ quarantine tests.

The consumer loads blocks 3, 4 of the producer into its blocks 1, 2 (asynchronously), on a
fake clock the test advances; the engines under the (fault-free unless told) chaos wrapper
are whatever the test passes: in-memory, NIXL or mori.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import StepReport
from moriio.domain.worker.stats import WorkerStats, worker_stats
from moriio.ports import TransferEngine
from moriio.testing.handoffs import signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Stack, Timing, build_stack
from support.worker_stacks import CONSUMER, PRODUCER

UID = 9  # the request whose KV the producer computed
LOCAL, REMOTE = (1, 2), (3, 4)


@dataclass
class ReadWorld:
    clock: FakeClock
    producer: Stack
    consumer: Stack
    p_memory: KVMemory
    d_memory: KVMemory
    timing: Timing
    reports: list[StepReport] = field(default_factory=list)

    def start_read(self, request_id: str = "d-1", transfer_id: str = "tx-1") -> None:
        self.producer.service.start_step(
            StepOrders(holds=[HoldOrder(f"p-{request_id}", transfer_id)]), self.clock.now()
        )
        peer = PeerEndpoint(
            HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1, instance_id="producer#0"
        )
        order = signed_read(
            ReadOrder(request_id, transfer_id, LOCAL, REMOTE, peer, None, load_async=True)
        )
        self.consumer.service.start_step(StepOrders(reads=[order]), self.clock.now())

    def step(self, seconds: float = 0.0) -> StepReport:
        """Advance the clock, then run one consumer step (and let the producer answer)."""
        self.clock.advance(seconds)
        self.producer.service.pump()
        report = self.consumer.service.finish_step()
        self.reports.append(report)
        return report

    def loaded(self) -> bool:
        """Whether blocks 1, 2 hold the producer's KV (the read's bytes landed)."""
        return self.d_memory.holds(UID, LOCAL, 0)

    def untouched(self) -> bool:
        """Whether blocks 1, 2 still hold nothing any transfer wrote."""
        return self.d_memory.dirty_blocks(LOCAL) == []

    @property
    def stats(self) -> WorkerStats:
        return worker_stats(self.consumer.service.ctx, take_samples=False)

    @property
    def quarantined_batches(self) -> int:
        return self.consumer.service.ctx.poster.stats.quarantined


def read_world(
    engine: Callable[[str], TransferEngine] | None,
    timing: Timing,
    *,
    consumer_plan: EngineFaultPlan | None = None,
    block_size: int = 4,
    num_blocks: int = 8,
) -> ReadWorld:
    """Both workers, the producer's KV computed into blocks 3, 4. ``engine(name)`` builds
    each side's engine (None: in-memory ones); ``consumer_plan`` injects faults there."""
    clock = FakeClock()
    fabric, network = InMemoryFabric(), InMemoryNetwork(clock)
    memories = [KVMemory(2, num_blocks, block_size) for _ in range(2)]
    stacks = [
        build_stack(
            name=name,
            mode=TransferMode.READ,
            is_producer=is_producer,
            endpoint=PRODUCER if is_producer else CONSUMER,
            memory=memory,
            clock=clock,
            fabric=fabric,
            network=network,
            timing=timing,
            rng=random.Random(7),
            engine_plan=(EngineFaultPlan() if is_producer else consumer_plan or EngineFaultPlan()),
            channel_plan=ChannelFaultPlan(),
            inner=None if engine is None else engine(name),
        )
        for name, is_producer, memory in (
            ("producer#0", True, memories[0]),
            ("consumer#0", False, memories[1]),
        )
    ]
    memories[0].write(UID, REMOTE, 0)
    return ReadWorld(clock, stacks[0], stacks[1], memories[0], memories[1], timing)
