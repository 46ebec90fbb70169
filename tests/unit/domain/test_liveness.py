"""Peer liveness: consumers probe the producers they wait on; producers give up the transfers
of consumers whose probes stopped. In-memory channels and a fake clock; then real in-memory
workers, each side losing its peer.
"""

from __future__ import annotations

import random

from moriio.adapters.chaos import ChannelFault, ChannelFaultPlan, ChaosControlChannel
from moriio.domain.params.orders import ExpectWriteOrder, HoldOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message, Probe, ProbeReply
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.liveness import (
    MAX_CLAIMANTS,
    MAX_INBOX_CLAIMS,
    READ_PRODUCER_SILENCE,
    ConsumerClaims,
    Lost,
    ProbeInbox,
    ProducerProbes,
)
from moriio.ports import PeerAddress
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.inmemory.channel import InMemoryControlChannel
from moriio.testing.stacks.stack import HOST, Timing
from support.worker_stacks import PRODUCER, worker_stack

TIMEOUT = 2.0
INTERVAL = TIMEOUT / 4
PRODUCER_AT = PeerAddress("127.0.0.1", 7100)
TOKEN = "a" * 32
OTHER_TOKEN = "b" * 32


class Net:
    """A consumer probing through a chaos wrapper (with ``faults``, quiet by default)."""

    def __init__(self, faults: ChannelFaultPlan | None = None) -> None:
        self.clock = FakeClock()
        self.network = InMemoryNetwork(self.clock)
        self.consumer: InMemoryControlChannel[Message] = InMemoryControlChannel(
            self.network, WIRE_CODEC, "127.0.0.1", 8100, trusted_hosts=["127.0.0.1"]
        )
        self.chaos = ChaosControlChannel(
            self.consumer, random.Random(0), faults or ChannelFaultPlan(), self.clock
        )
        self.probes = ProducerProbes(
            self.chaos,
            self.clock,
            instance_id="consumer#1",
            control=self.consumer.address,
            timeout=TIMEOUT,
            background=False,
        )
        self.heard: list[Probe] = []

    def producer(self, instance_id: str) -> InMemoryControlChannel[Message]:
        channel: InMemoryControlChannel[Message] = InMemoryControlChannel(
            self.network, WIRE_CODEC, PRODUCER_AT.host, PRODUCER_AT.port
        )

        def answer(message: Message) -> Message:
            assert isinstance(message, Probe)
            self.heard.append(message)
            return ProbeReply(instance_id)

        channel.serve(answer)
        return channel

    def run(self, seconds: float, step: float = INTERVAL / 2) -> list[Lost]:
        lost: list[Lost] = []
        end = self.clock.now() + seconds
        while self.clock.now() < end:
            lost += self.probes.tick()
            self.clock.advance(step)
        return lost


def test_nothing_is_sent_while_no_transfer_is_live() -> None:
    net = Net()
    net.producer("producer#1")
    assert net.run(10 * TIMEOUT) == []
    assert net.consumer.requests == []


def test_a_producer_that_answers_is_never_given_up_and_is_told_the_claims() -> None:
    net = Net()
    net.producer("producer#1")
    net.probes.watch("tx-1", PRODUCER_AT, TOKEN, "producer#1")
    assert net.run(10 * TIMEOUT) == []
    assert 35 <= net.probes.probes_sent <= 41  # one per interval, not one per tick
    assert {p.claims for p in net.heard} == {(("tx-1", TOKEN),)}
    assert {p.instance_id for p in net.heard} == {"consumer#1"}
    net.probes.unwatch("tx-1")
    sent = net.probes.probes_sent
    assert net.run(10 * TIMEOUT) == []
    assert net.probes.probes_sent == sent  # nothing live: no probe


def test_a_producer_nobody_listens_for_is_given_up_at_the_first_probe() -> None:
    net = Net()
    net.probes.watch("tx-1", PRODUCER_AT, TOKEN, "producer#1")
    net.probes.watch("tx-2", PRODUCER_AT, TOKEN, None)
    (lost,) = net.run(2 * INTERVAL)  # the probe times out, the connection is refused
    assert lost.dead
    assert set(lost.transfer_ids) == {"tx-1", "tx-2"}
    assert "nothing listens" in lost.reason
    assert net.probes.num_watched == 0


def test_a_silent_producer_is_given_up_after_the_timeout_but_not_called_dead() -> None:
    net = Net(ChannelFaultPlan(request_drop=1.0))  # it listens, and never answers
    net.producer("producer#1")
    net.probes.watch("tx-1", PRODUCER_AT, TOKEN, "producer#1")
    started = net.clock.now()
    lost = net.run(2 * TIMEOUT, step=0.05)
    assert len(lost) == 1
    assert not lost[0].dead
    assert lost[0].transfer_ids == ("tx-1",)
    assert "did not answer" in lost[0].reason
    assert net.probes.producers_lost == 1
    assert net.chaos.injected[ChannelFault.REQUEST_DROPPED]  # probed before being given up
    given_up_at = started + TIMEOUT
    assert net.clock.now() >= given_up_at


def test_a_restarted_producer_ends_only_its_predecessors_transfers() -> None:
    net = Net()
    net.producer("producer#2")  # the address answers as a new instance
    net.probes.watch("tx-old", PRODUCER_AT, TOKEN, "producer#1")
    net.probes.watch("tx-unbound", PRODUCER_AT, TOKEN, None)
    (lost,) = net.run(INTERVAL)
    assert lost.dead
    assert lost.transfer_ids == ("tx-old",)
    assert "restarted" in lost.reason
    assert net.run(5 * TIMEOUT) == []  # the unbound one adopted the instance that answers
    assert net.probes.num_watched == 1


def test_an_answer_judges_only_transfers_watched_before_its_probe_was_sent() -> None:
    net = Net()
    net.producer("producer#1")
    net.probes.watch("tx-1", PRODUCER_AT, TOKEN, "producer#1")
    net.probes.tick()  # probe sent and answered by producer#1; the answer is applied later
    net.clock.advance(0.01)
    net.probes.watch("tx-2", PRODUCER_AT, TOKEN, "producer#2")  # a later instance's
    assert net.probes.tick() == []
    assert net.probes.num_watched == 2


def test_a_dead_verdict_spares_transfers_watched_after_its_probe_was_sent() -> None:
    net = Net()
    net.probes.watch("tx-1", PRODUCER_AT, TOKEN, "producer#1")
    net.probes.tick()  # the probe times out; nobody listens; applied at the next tick
    net.producer("producer#2")  # restarted meanwhile: a transfer of the new instance starts
    net.probes.watch("tx-2", PRODUCER_AT, TOKEN, "producer#2")
    (lost,) = net.probes.tick()
    assert lost.transfer_ids == ("tx-1",)
    assert net.run(5 * TIMEOUT) == []  # the new instance answers for tx-2


def test_claims_bind_transfers_only_with_their_capability() -> None:
    claims = ConsumerClaims(silence=3.0)
    consumer = (PeerAddress("127.0.0.1", 8100), "consumer#1")
    probe = Probe("consumer#1", consumer[0], (("tx-1", TOKEN), ("tx-2", OTHER_TOKEN)))
    claims.record([(probe, 0.0)], lambda tid, token: token == TOKEN)
    assert claims.num_claimed == 1
    assert claims.claims_refused == 1
    assert claims.silent(2.9) == []
    assert claims.silent(3.1) == ["tx-1"]
    assert claims.silent(10.0) == []  # given up once
    assert claims.num_claimed == 0


def test_a_claimant_that_keeps_probing_keeps_its_transfers() -> None:
    claims = ConsumerClaims(silence=3.0)
    address = PeerAddress("127.0.0.1", 8100)
    for t in range(10):
        probe = Probe("consumer#1", address, (("tx-1", TOKEN),))
        claims.record([(probe, float(t))], lambda tid, token: True)
        assert claims.silent(float(t) + 0.5) == []
    claims.drop("tx-1")
    assert claims.num_claimed == 0


def test_a_flood_of_probes_is_answered_but_queues_a_bounded_number_of_claims() -> None:
    inbox = ProbeInbox("producer#1", FakeClock())
    address = PeerAddress("10.9.9.9", 9)
    big = Probe("x", address, tuple((f"t{i}", TOKEN) for i in range(4096)))
    answers = {inbox.answer(big).instance_id for _ in range(100)}
    assert answers == {"producer#1"}  # every probe is answered
    taken = inbox.take()
    assert sum(len(p.claims) for p, _ in taken) <= MAX_INBOX_CLAIMS
    assert inbox.dropped == 100 - len(taken)
    assert inbox.take() == []


def test_strangers_without_a_capability_cannot_crowd_consumers_out() -> None:
    claims = ConsumerClaims(silence=3.0)
    strangers = [
        (Probe(f"s{i}", PeerAddress("10.9.9.9", 1 + i % 60000), (("tx-1", OTHER_TOKEN),)), 0.0)
        for i in range(MAX_CLAIMANTS + 10)
    ]
    claims.record(strangers, lambda tid, token: token == TOKEN)
    consumer = Probe("consumer#1", PeerAddress("127.0.0.1", 8100), (("tx-1", TOKEN),))
    claims.record([(consumer, 0.0)], lambda tid, token: token == TOKEN)
    assert claims.num_claimed == 1
    assert claims.silent(3.1) == ["tx-1"]


def test_liveness_off_sends_nothing_and_gives_nothing_up() -> None:
    net = Net()
    off = ProducerProbes(
        net.consumer,
        net.clock,
        instance_id="c",
        control=net.consumer.address,
        timeout=0.0,
        background=False,
    )
    off.watch("tx-1", PRODUCER_AT, TOKEN, "producer#1")
    for _ in range(100):
        assert off.tick() == []
        net.clock.advance(1.0)
    assert net.consumer.requests == []
    assert ConsumerClaims(silence=0.0).silent(1e9) == []


# -- real in-memory workers ---------------------------------------------------------------

TIMING = Timing(transfer_timeout=5.0, defer_timeout=30.0, liveness_timeout=TIMEOUT)
PRODUCER_PEER = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)


def test_a_write_consumer_answers_at_once_when_its_producer_dies() -> None:
    """Without liveness it would wait out the write fence (defer + transfer + quarantine)."""
    clock, fabric = FakeClock(), InMemoryFabric()
    net = InMemoryNetwork(clock)
    producer, _ = worker_stack("producer", True, TransferMode.WRITE, clock, fabric, net, TIMING)
    consumer, _ = worker_stack("consumer", False, TransferMode.WRITE, clock, fabric, net, TIMING)
    order = ExpectWriteOrder("d-1", "tx-1", (4, 5), 0, PRODUCER_PEER, prompt=PROMPT)
    consumer.service.start_step(StepOrders(expect_writes=[order]), 0.0)
    assert consumer.service.finish_step().finished_recving == set()
    producer.crash()  # killed: nothing listens at its ports any more
    failed: set[str] = set()
    while not failed and clock.now() < TIMEOUT:
        clock.advance(0.01)
        failed = consumer.service.finish_step().failed_recving
    assert failed == {"d-1"}
    # At the first probe after the death (one interval, plus its wait for an answer), not
    # after the liveness bound, let alone the write fence.
    assert clock.now() <= 2 * INTERVAL + 0.05
    assert consumer.service.ctx.counters.failures_by_kind == {"lost": 1}


def test_a_read_producer_frees_blocks_whose_consumer_stopped_probing() -> None:
    clock, fabric = FakeClock(), InMemoryFabric()
    net = InMemoryNetwork(clock)
    producer, _ = worker_stack("producer", True, TransferMode.READ, clock, fabric, net, TIMING)
    service = producer.service
    service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1", TOKEN)]), 0.0)
    service.finish_step()
    consumer = PeerAddress("127.0.0.1", 8100)
    service.ctx.peers.respond(Probe("consumer#1", consumer, (("tx-1", TOKEN),)))
    freed: set[str] = set()
    while not freed and clock.now() < 10 * TIMEOUT:
        clock.advance(0.05)
        freed = service.finish_step().finished_sending
    assert freed == {"p-1"}
    bound = READ_PRODUCER_SILENCE * TIMEOUT
    assert bound < clock.now() <= bound + 0.1  # not at the 30 s lease
    assert service.ctx.counters.failures_by_kind == {"consumer_lost": 1}
