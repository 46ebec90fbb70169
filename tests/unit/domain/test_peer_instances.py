"""Instance identity: a peer restarted on its old address is a new instance, never the old one.

Real in-memory workers (engine, channels, KV, services) on one fabric: a restarted worker
listens on its predecessor's ports under a new instance id and holds other data.
"""

from __future__ import annotations

import itertools
import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import (
    HoldOrder,
    ReadOrder,
    ReleaseOrder,
    SaveOrder,
    StepOrders,
)
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.messages import Release, RemoteBlocks, WriteDone, WriteFailed
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.peer_checks import PeerRestartedError, PeerUnavailableError
from moriio.domain.worker.peers import PeerDirectory
from moriio.ports import PeerAddress
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
BLOCKS = 16


class World:
    """One fabric, network and clock; workers start (and restart) on fixed endpoints."""

    def __init__(self, mode: TransferMode, timing: Timing | None = None) -> None:
        self.mode = mode
        self.clock = FakeClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        self.rng = random.Random(7)
        self.timing = timing or Timing()

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
            timing=self.timing,
            rng=self.rng,
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
        )
        return stack, memory


HANDSHAKE = PeerAddress(HOST, PRODUCER.handshake_port)


@pytest.fixture
def read_world() -> World:
    return World(TransferMode.READ)


def test_a_handshake_records_the_peer_instance(read_world: World) -> None:
    read_world.start("producer#0", producer=True)
    consumer, _ = read_world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    assert peers.instance_id == "consumer#0"
    assert peers.connect(HANDSHAKE).instance_id == "producer#0"
    assert peers.connect(HANDSHAKE, "producer#0").instance_id == "producer#0"
    assert peers.handshakes == 1


def test_the_new_instance_of_a_restarted_peer_replaces_the_stale_connection(
    read_world: World,
) -> None:
    old, _ = read_world.start("producer#0", producer=True)
    consumer, _ = read_world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    peers.connect(HANDSHAKE, "producer#0")
    old.crash()
    read_world.start("producer#1", producer=True)

    peer = peers.connect(HANDSHAKE, "producer#1")
    assert peer.instance_id == "producer#1"
    assert (peers.handshakes, peers.restarts_seen) == (2, 1)
    assert peers.is_gone("producer#0")
    assert not peers.is_gone("producer#1")
    assert not peers.is_gone(None)
    # The dead instance's transfers are refused at once: no handshake, same connection.
    requests = len(consumer.inner_channel.requests)
    with pytest.raises(PeerRestartedError, match="'producer#0' is gone"):
        peers.connect(HANDSHAKE, "producer#0")
    assert len(consumer.inner_channel.requests) == requests
    assert peers.connect(HANDSHAKE, "producer#1") is peer


def test_a_stale_instance_costs_one_handshake_and_keeps_the_live_connection(
    read_world: World,
) -> None:
    read_world.start("producer#1", producer=True)
    consumer, _ = read_world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    live = peers.connect(HANDSHAKE, "producer#1")
    requests = len(consumer.inner_channel.requests)

    with pytest.raises(PeerRestartedError):
        peers.connect(HANDSHAKE, "producer#0")  # an instance this address never answered as
    assert len(consumer.inner_channel.requests) == requests + 1
    with pytest.raises(PeerRestartedError):
        peers.connect(HANDSHAKE, "producer#0")
    assert len(consumer.inner_channel.requests) == requests + 1
    assert peers.connect(HANDSHAKE, "producer#1") is live
    assert (peers.handshakes, peers.restarts_seen) == (2, 0)  # the check was a handshake


def test_forget_checks_the_instance_again_and_keeps_a_live_peer(read_world: World) -> None:
    old, _ = read_world.start("producer#0", producer=True)
    consumer, _ = read_world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    live = peers.connect(HANDSHAKE)
    requests = len(consumer.inner_channel.requests)

    peers.forget(HANDSHAKE)
    assert peers.connect(HANDSHAKE) is live  # same instance: in-flight transfers untouched
    assert len(consumer.inner_channel.requests) == requests + 1
    assert peers.connect(HANDSHAKE) is live  # checked once, not on every use

    peers.forget(HANDSHAKE)
    old.crash()
    read_world.start("producer#1", producer=True)
    assert peers.connect(HANDSHAKE, "producer#1").instance_id == "producer#1"
    assert peers.restarts_seen == 1


def test_transfers_naming_no_instance_are_refused_once_the_address_restarted(
    read_world: World,
) -> None:
    """Params without ``remote_instance_id`` may be the dead instance's: never served by
    its successor (before any restart they are served as they always were)."""
    old, _ = read_world.start("producer#0", producer=True)
    consumer, _ = read_world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    assert peers.connect(HANDSHAKE).instance_id == "producer#0"
    old.crash()
    read_world.start("producer#1", producer=True)
    peers.forget(HANDSHAKE)  # a read failed
    with pytest.raises(PeerRestartedError, match="remote_instance_id"):
        peers.connect(HANDSHAKE)
    assert peers.connect(HANDSHAKE, "producer#1").instance_id == "producer#1"
    with pytest.raises(PeerRestartedError, match="remote_instance_id"):
        peers.connect(HANDSHAKE)


def _consumer_peers_after_the_producer_died(world: World) -> PeerDirectory:
    """A consumer's peers, handshaken with a producer that then crashed and was forgotten
    (as after a failed transfer)."""
    old, _ = world.start("producer#0", producer=True)
    consumer, _ = world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    peers.connect(HANDSHAKE)
    old.crash()
    peers.forget(HANDSHAKE)
    return peers


def test_forget_of_a_dead_peer_fails_its_next_use_and_backs_off() -> None:
    world = World(TransferMode.READ, Timing(handshake_retry_after=1.0))
    peers = _consumer_peers_after_the_producer_died(world)
    with pytest.raises(PeerUnavailableError, match="no reply"):
        peers.connect(HANDSHAKE)
    with pytest.raises(PeerUnavailableError, match="unavailable"):
        peers.connect(HANDSHAKE)
    assert peers.handshake_failures == 1


def test_a_peer_a_transfer_just_failed_with_gets_the_liveness_bound_to_answer() -> None:
    """A handshake with a peer whose transfer failed waits at most ``liveness_timeout`` (a
    live peer answers probes within it); a peer never seen keeps ``handshake_timeout``."""
    world = World(TransferMode.READ, Timing(handshake_timeout=10.0, liveness_timeout=2.0))
    peers = _consumer_peers_after_the_producer_died(world)
    started = world.clock.now()
    with pytest.raises(PeerUnavailableError, match=r"no reply .* within 2 s"):
        peers.connect(HANDSHAKE)
    assert world.clock.now() - started == pytest.approx(2.0)
    started = world.clock.now()
    with pytest.raises(PeerUnavailableError, match=r"no reply .* within 10 s"):
        peers.connect(PeerAddress(HOST, 7999))  # nothing listens, and nothing failed there
    assert world.clock.now() - started == pytest.approx(10.0)


def _read(tid: str, local: tuple[int, ...], remote: tuple[int, ...], instance: str) -> ReadOrder:
    peer = PeerEndpoint(
        HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1, instance_id=instance
    )
    return signed_read(
        ReadOrder(f"d-{tid}", tid, local, remote, peer, None), instance or "producer#0"
    )


def _releases(stack: Stack) -> list[str]:
    return [
        s.message.transfer_id for s in stack.inner_channel.sent if isinstance(s.message, Release)
    ]


def test_a_read_minted_by_a_restarted_producer_is_refused_and_not_released(
    read_world: World,
) -> None:
    old, _ = read_world.start("producer#0", producer=True)
    consumer, d_memory = read_world.start("consumer#0", producer=False)
    service = consumer.service
    service.ctx.peers.connect(HANDSHAKE, "producer#0")  # the cached connection goes stale
    old.crash()
    producer, p_memory = read_world.start("producer#1", producer=True)
    p_memory.write(5, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-new", "tx-new")]), 0.0)

    # The new instance's params: a fresh handshake, the right bytes, a release.
    service.start_step(StepOrders(reads=[_read("tx-new", (1, 2), (3, 4), "producer#1")]), 0.0)
    for layer in d_memory.layer_names:
        service.wait_for_layer(layer)
    report = service.finish_step()
    assert report.invalid_block_ids == set()
    assert d_memory.holds(5, (1, 2), 0)
    assert producer.service.finish_step().finished_sending == {"p-new"}

    # Params minted by the dead instance: refused as a load error, nothing sent to the new one.
    stale = [_read("tx-old", (6, 7), (3, 4), "producer#0")]
    service.start_step(
        StepOrders(reads=stale, releases=[ReleaseOrder("d-x", "tx-x", stale[0].peer)]), 0.0
    )
    for layer in d_memory.layer_names:
        service.wait_for_layer(layer)
    report = service.finish_step()
    assert report.invalid_block_ids == {6, 7}
    assert d_memory.dirty_blocks((6, 7)) == []  # nothing was read into them
    assert service.ctx.counters.failures_by_kind == {"restarted": 1}
    assert _releases(consumer) == ["tx-new"]
    producer.service.pump()
    assert producer.service.producer is not None
    assert producer.service.producer.pending_buffers["buffered_releases"] == 0


def test_blocks_announced_by_a_restarted_consumer_are_never_written() -> None:
    world = World(TransferMode.WRITE)
    producer, p_memory = world.start("producer#0", producer=True)
    old, _ = world.start("consumer#0", producer=False)
    old.crash()
    consumer, d_memory = world.start("consumer#1", producer=False)
    p_memory.write(9, (1, 2, 3), 0)
    service = producer.service
    service.start_step(
        StepOrders(saves=[SaveOrder("p-old", "tx-old", ((1, 2, 3),), None, prompt=PROMPT)]), 0.0
    )
    assert service.producer is not None
    service.producer.on_remote_blocks(
        RemoteBlocks(
            transfer_id="tx-old",
            request_id="d-old",
            block_ids=(4, 5, 6),
            first_block=0,
            consumer_dp_rank=0,
            consumer_tp_rank=0,
            consumer_tp_size=1,
            reply_to=consumer.channel.address,
            consumer_instance_id="consumer#0",
            write_by=service.ctx.wall_now() + 60.0,
            prompt=PROMPT,
        )
    )
    for layer in p_memory.layer_names:
        service.save_layer(layer)
    service.end_forward()
    service.start_step(StepOrders(holds=[HoldOrder("p-old", "tx-old")]), 0.0)
    assert service.finish_step().finished_sending == {"p-old"}  # the producer's blocks are free
    assert service.ctx.counters.failures_by_kind == {"restarted": 1}
    assert d_memory.dirty_blocks(list(range(BLOCKS))) == []  # nothing written into the new process
    verdicts = [
        s for s in producer.inner_channel.sent if isinstance(s.message, WriteDone | WriteFailed)
    ]
    assert verdicts == []  # the old instance is gone: no verdict to send
    assert service.ctx.peers.connect(consumer.channel.address, "consumer#1").instance_id == (
        "consumer#1"
    )
    assert service.ctx.peers.handshakes == 1


def test_repeated_handshake_failures_back_off_exponentially() -> None:
    world = World(TransferMode.READ, Timing(handshake_retry_after=1.0))
    peers = _consumer_peers_after_the_producer_died(world)
    waits = []
    failed_at = world.clock.now()
    while len(waits) < 4:
        attempts = peers.handshake_failures
        with pytest.raises(PeerUnavailableError):
            peers.connect(HANDSHAKE)  # a real attempt, or refused by the back-off
        if peers.handshake_failures > attempts:  # a real attempt was made (and failed)
            waits.append(world.clock.now() - failed_at)
            failed_at = world.clock.now()
        world.clock.advance(0.25)
    # Each wait: the back-off (doubling from 1 s) plus the failed handshake's own timeout.
    gaps = [b - a for a, b in itertools.pairwise(waits[1:])]
    assert all(gap > 0.5 for gap in gaps), waits


def test_a_transfer_of_a_new_instance_handshakes_despite_the_back_off() -> None:
    """A restarted producer hands off under its new instance id: the consumer does not make
    it wait out the back-off its dead predecessor earned, once per instance id."""
    world = World(TransferMode.READ, Timing(handshake_retry_after=30.0))
    old, _ = world.start("producer#0", producer=True)
    consumer, _ = world.start("consumer#0", producer=False)
    peers = consumer.service.ctx.peers
    peers.connect(HANDSHAKE, "producer#0")
    old.crash()
    peers.forget(HANDSHAKE)
    with pytest.raises(PeerUnavailableError, match="no reply"):
        peers.connect(HANDSHAKE, "producer#0")
    with pytest.raises(PeerUnavailableError, match="unavailable"):
        peers.connect(HANDSHAKE)  # names no instance: backed off
    world.start("producer#1", producer=True)
    assert peers.connect(HANDSHAKE, "producer#1").instance_id == "producer#1"
    with pytest.raises(PeerRestartedError):
        peers.connect(HANDSHAKE, "producer#0")


def test_a_read_is_refused_when_a_slow_handshake_ate_the_producers_lease(
    read_world: World,
) -> None:
    read_world.start("producer#0", producer=True)
    consumer, d_memory = read_world.start("consumer#0", producer=False)
    service = consumer.service
    channel = service.ctx.channel  # the channel handshakes are asked on
    real_request = channel.request
    transfer_timeout = service.ctx.policy.transfer_timeout

    def slow_request(address: PeerAddress, message: object, timeout: float) -> object:
        read_world.clock.advance(5.0)  # the handshake took 5 s
        return real_request(address, message, timeout)  # type: ignore[arg-type]

    channel.request = slow_request  # type: ignore[method-assign,assignment]
    order = _read("tx-1", (1, 2), (3, 4), "producer#0")._replace(
        lease_expires_at=100.0 + transfer_timeout + 2.0  # enough before, not after the handshake
    )
    service.start_step(StepOrders(reads=[order]), 100.0)
    for layer in d_memory.layer_names:
        service.wait_for_layer(layer)
    report = service.finish_step()
    assert report.invalid_block_ids == {1, 2}
    assert service.ctx.counters.lease_refusals == 1
    assert d_memory.dirty_blocks((1, 2)) == []
