"""READ leases on another host's clock: shortened by the skew allowance; absurd ones refused.

Real in-memory workers on one fabric and fake clock; the producer mints the lease on its
wall clock and the consumer checks it on its own.
"""

from __future__ import annotations

import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint, TransferParams
from moriio.domain.protocol.messages import Release
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.scheduler.producer.read_book import ReadProducerBook
from moriio.domain.timing.policy import MAX_LEASE_SECONDS, TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
_ENDPOINT = LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0")
TIMING = Timing(transfer_timeout=0.05, defer_timeout=1.0, clock_skew_allowance=0.5)


def _consumer() -> Stack:
    clock = FakeClock()
    fabric, network, rng = InMemoryFabric(), InMemoryNetwork(clock), random.Random(5)
    stacks = [
        build_stack(
            name=name,
            mode=TransferMode.READ,
            is_producer=producer,
            endpoint=PRODUCER if producer else CONSUMER,
            memory=KVMemory(2, 16, 4),
            clock=clock,
            fabric=fabric,
            network=network,
            timing=TIMING,
            rng=rng,
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
        )
        for name, producer in (("producer#0", True), ("consumer#0", False))
    ]
    return stacks[1]


def _read(lease: float) -> ReadOrder:
    peer = PeerEndpoint(
        HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1, instance_id="producer#0"
    )
    return signed_read(ReadOrder("d-1", "tx-1", (1, 2), (3, 4), peer, lease))


def _load(consumer: Stack, lease: float, wall_now: float = 100.0) -> set[int]:
    service = consumer.service
    service.start_step(StepOrders(reads=[_read(lease)]), wall_now)
    service.wait_for_all_reads()
    return service.finish_step().invalid_block_ids


@pytest.mark.parametrize(
    ("lease", "refused"),
    [
        # Enough for a transfer on our clock, not once the producer's may be 0.5 s behind.
        (100.0 + 0.05 + 0.4, True),
        (100.0 + 0.05 + 0.6, False),
        # Further ahead than any configuration makes: a lease that fences nothing.
        (100.0 + 2 * MAX_LEASE_SECONDS, True),
    ],
)
def test_a_read_lease_is_shortened_by_the_skew_allowance(lease: float, refused: bool) -> None:
    consumer = _consumer()
    invalid = _load(consumer, lease)
    counters = consumer.service.ctx.counters
    assert counters.lease_refusals == int(refused)
    assert invalid == ({1, 2} if refused else set())
    releases = [s.message for s in consumer.inner_channel.sent if isinstance(s.message, Release)]
    # Read: the verified hand-off is released. Refused before any handshake: it was never
    # verified for this request, so nothing is released (the producer reclaims at its lease).
    assert len(releases) == (0 if refused else 1)


def test_the_producer_reclaims_only_after_its_lease_plus_the_skew_allowance() -> None:
    policy = TransferPolicy(transfer_timeout=5.0, defer_timeout=10.0, clock_skew_allowance=2.0)
    book = ReadProducerBook(_ENDPOINT, policy)
    params = TransferParams("tx", False, True, None, None)
    book.on_allocated("p-1", params)
    decision = book.on_finished(
        "p-1",
        length_capped=True,
        block_ids=[1, 2],
        wall_now=1000.0,
        now=50.0,
        params=params,
        prompt=PROMPT,
    )
    assert decision.params is not None
    assert decision.params["lease_expires_at"] == 1010.0  # the lease handed out
    assert book.on_connector_output(None, 61.9) == set()  # past it, within the allowance
    assert book.on_connector_output(None, 62.0) == {"p-1"}


def test_a_negative_allowance_is_refused() -> None:
    with pytest.raises(ValueError, match="clock_skew_allowance"):
        TransferPolicy(defer_timeout=10.0, clock_skew_allowance=-1.0)


def test_a_book_refuses_anything_but_a_policy() -> None:
    with pytest.raises(TypeError, match=r"policy must be a TransferPolicy, got 10\.0"):
        ReadProducerBook(_ENDPOINT, 10.0)  # type: ignore[arg-type]
