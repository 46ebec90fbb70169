"""A decode worker reads (or frees) a hand-off only when it verifies: signed by the producer
it handshook, for this request's prompt. A WRITE producer pushes only into blocks announced
for the prompt it computed. Every refusal is named and counted, and moves nothing.

Real in-memory workers (engine, channels, KV, services) on one fabric and a fake clock.
"""

from __future__ import annotations

import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.handoff_tags import PromptBinding, new_handoff_key
from moriio.domain.params.orders import (
    AbortWriteOrder,
    ExpectWriteOrder,
    HoldOrder,
    ReadOrder,
    ReleaseOrder,
    SaveOrder,
    StepOrders,
)
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.messages import Release, WriteFailed
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.handshake_responder import NO_KEY_YET
from moriio.domain.worker.peer_checks import PeerUnavailableError
from moriio.ports import PeerAddress
from moriio.testing.handoffs import PROMPT, TEST_HANDOFF_KEY, prompt_binding, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Endpoint, Stack, Timing, build_stack

PRODUCER = Endpoint(handshake_port=7000, notify_port=7100)
CONSUMER = Endpoint(handshake_port=8000, notify_port=8100)
OTHER_PROMPT = prompt_binding("another prompt")
KV = 7  # the value the producer computed into its blocks


class World:
    """One fabric, network and clock; workers start (and restart) on fixed endpoints."""

    def __init__(self, mode: TransferMode) -> None:
        self.mode = mode
        self.clock = FakeClock()
        self.fabric = InMemoryFabric()
        self.network = InMemoryNetwork(self.clock)
        self.rng = random.Random(11)
        self.memories: list[KVMemory] = []  # the producers' KV, which reads copy from

    def start(
        self, name: str, *, producer: bool, key: bytes | None = TEST_HANDOFF_KEY
    ) -> tuple[Stack, KVMemory]:
        memory = KVMemory(2, 16, 4)
        stack = build_stack(
            name=name,
            mode=self.mode,
            is_producer=producer,
            endpoint=PRODUCER if producer else CONSUMER,
            memory=memory,
            clock=self.clock,
            fabric=self.fabric,
            network=self.network,
            timing=Timing(),
            rng=self.rng,
            engine_plan=EngineFaultPlan(),
            channel_plan=ChannelFaultPlan(),
            handoff_key=key,
        )
        return stack, memory


def _peer(instance: str | None = "producer#0") -> PeerEndpoint:
    return PeerEndpoint(
        HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1, instance_id=instance
    )


def _order(tid: str = "tx-1", local: tuple[int, ...] = (1, 2), **peer: str | None) -> ReadOrder:
    return ReadOrder(f"d-{tid}", tid, local, (3, 4), _peer(**peer), None)


def _held(world: World, name: str = "producer#0", **start: bytes | None) -> Stack:
    """A producer holding ``tx-1``'s blocks (3, 4) for a decode to read (its memory stays
    alive with the world, as an engine's KV does)."""
    producer, memory = world.start(name, producer=True, **start)
    memory.write(KV, (3, 4), 0)
    world.memories.append(memory)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    return producer


def _load(consumer: Stack, memory: KVMemory, *orders: ReadOrder) -> set[int]:
    service = consumer.service
    service.start_step(StepOrders(reads=list(orders)), 0.0)
    for layer in memory.layer_names:
        service.wait_for_layer(layer)
    return service.finish_step().invalid_block_ids


def _releases(stack: Stack) -> list[str]:
    return [
        s.message.transfer_id for s in stack.inner_channel.sent if isinstance(s.message, Release)
    ]


@pytest.fixture
def world() -> World:
    return World(TransferMode.READ)


def _refused(consumer: Stack, kind: str) -> None:
    counters = consumer.service.ctx.counters
    assert counters.handoffs_refused == 1
    assert counters.failures_by_kind == {kind: 1}
    assert consumer.service.ctx.poster.stats.posts == 0  # nothing was read
    assert _releases(consumer) == []  # nor freed on the request's behalf


def test_unsigned_params_are_refused_before_any_handshake(world: World) -> None:
    producer = _held(world)
    consumer, memory = world.start("consumer#0", producer=False)
    assert _load(consumer, memory, _order()) == {1, 2}
    _refused(consumer, "unsigned")
    assert consumer.service.ctx.peers.handshakes == 0
    assert not memory.holds(KV, (1, 2), 0)
    assert producer.service.finish_step().finished_sending == set()


def test_params_signed_with_another_key_are_refused_after_the_handshake(world: World) -> None:
    _held(world)
    consumer, memory = world.start("consumer#0", producer=False)
    forged = signed_read(_order(), key=new_handoff_key())
    assert _load(consumer, memory, forged) == {1, 2}
    _refused(consumer, "bad_tag")
    assert consumer.service.ctx.peers.handshakes == 1
    assert not memory.holds(KV, (1, 2), 0)


def test_genuine_params_replayed_for_another_prompt_load_nothing_and_free_nothing(
    world: World,
) -> None:
    producer = _held(world)
    consumer, memory = world.start("consumer#0", producer=False)
    replayed = signed_read(_order(), prompt=OTHER_PROMPT, signed_prompt=PROMPT)
    assert _load(consumer, memory, replayed) == {1, 2}
    _refused(consumer, "prompt_mismatch")
    assert not memory.holds(KV, (1, 2), 0)
    assert producer.service.finish_step().finished_sending == set()  # still held
    # The request it was computed for still loads it, from the same held blocks.
    genuine = signed_read(_order(local=(5, 6)))
    assert _load(consumer, memory, genuine) == set()
    assert memory.holds(KV, (5, 6), 0)
    assert _releases(consumer) == ["tx-1"]
    assert producer.service.finish_step().finished_sending == {"p-1"}


def test_engines_that_bind_prompts_differently_are_refused_by_name(world: World) -> None:
    _held(world)
    consumer, memory = world.start("consumer#0", producer=False)
    ours = PromptBinding("sha256-16-0badf00d", PROMPT.num_tokens, b"\x01" * 36)
    order = signed_read(_order(), prompt=ours, signed_prompt=PROMPT)
    assert _load(consumer, memory, order) == {1, 2}
    _refused(consumer, "prompt_scheme")


def test_a_restarted_prefills_old_hand_offs_are_refused(world: World) -> None:
    """Its key rotated: params that name no instance (a router that drops
    ``remote_instance_id``) are refused by their tag, the new instance's load."""
    old = _held(world)
    old.crash()
    _held(world, "producer#1", key=new_handoff_key())
    consumer, memory = world.start("consumer#0", producer=False)
    stale = signed_read(_order(instance=None))  # signed by producer#0's key
    assert _load(consumer, memory, stale) == {1, 2}
    _refused(consumer, "bad_tag")


def test_a_producer_answers_handshakes_only_once_it_has_its_key(world: World) -> None:
    producer = _held(world, key=None)
    consumer, memory = world.start("consumer#0", producer=False)
    assert _load(consumer, memory, signed_read(_order())) == {1, 2}
    assert consumer.service.ctx.counters.failures_by_kind == {"handshake": 1}
    assert _releases(consumer) == []
    with pytest.raises(PeerUnavailableError, match=NO_KEY_YET):  # backed off, by name
        consumer.service.ctx.peers.lookup(PeerAddress(HOST, PRODUCER.handshake_port))
    assert producer.service.ctx.peers.rejected_requests == 0  # not the peer's fault
    producer.service.set_handoff_key(TEST_HANDOFF_KEY)  # the scheduler's first step
    world.clock.advance(Timing().handshake_retry_after)
    assert _load(consumer, memory, signed_read(_order(local=(5, 6)))) == set()
    assert memory.holds(KV, (5, 6), 0)


def test_a_peer_whose_handshake_carries_no_key_is_refused_by_name(world: World) -> None:
    """A READ consumer handshakes only producers: one that signs nothing (here, a decode
    answering at the address) is refused at the handshake, naming why."""
    consumer, _ = world.start("consumer#0", producer=False)
    with pytest.raises(PeerUnavailableError, match="does not sign its hand-offs"):
        consumer.service.ctx.peers.connect(PeerAddress(HOST, CONSUMER.handshake_port))


def _release_order(prompt: PromptBinding) -> ReleaseOrder:
    order = signed_read(_order(), prompt=prompt, signed_prompt=PROMPT)
    return ReleaseOrder("d-r", "tx-1", _peer(), order.token, order.handoff)


def test_an_abort_frees_a_hand_off_only_for_its_own_prompt(world: World) -> None:
    producer = _held(world)
    consumer, _ = world.start("consumer#0", producer=False)
    service = consumer.service
    service.ctx.peers.connect(PeerAddress(HOST, PRODUCER.handshake_port), "producer#0")
    service.start_step(StepOrders(releases=[_release_order(OTHER_PROMPT)]), 0.0)
    assert _releases(consumer) == []
    assert service.ctx.counters.handoffs_refused == 1
    assert producer.service.finish_step().finished_sending == set()
    service.start_step(StepOrders(releases=[_release_order(PROMPT)]), 0.0)
    assert _releases(consumer) == ["tx-1"]
    assert producer.service.finish_step().finished_sending == {"p-1"}


@pytest.mark.parametrize(("prompt", "freed"), [(PROMPT, True), (OTHER_PROMPT, False)])
def test_an_abort_before_any_handshake_asks_for_the_key_then_frees_only_its_own_hand_off(
    world: World, prompt: PromptBinding, freed: bool
) -> None:
    """A decode that never read from the prefill (a full local prefix hit, an early abort)
    handshakes for the key off its path; the prefill's blocks are freed once the hand-off
    verifies, not left until the lease."""
    producer = _held(world)
    consumer, _ = world.start("consumer#0", producer=False)
    service = consumer.service
    service.start_step(StepOrders(releases=[_release_order(prompt)]), 0.0)
    for _ in range(3):
        service.finish_step()
        service.start_step(StepOrders(), 0.0)
    assert service.ctx.peers.handshakes == 1
    assert _releases(consumer) == (["tx-1"] if freed else [])
    assert service.ctx.counters.handoffs_refused == (0 if freed else 1)
    assert producer.service.finish_step().finished_sending == ({"p-1"} if freed else set())
    assert service.num_live == 0  # nothing parked any longer


# -- WRITE -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("announced", "kind"),
    [
        (OTHER_PROMPT, "prompt_mismatch"),
        (PromptBinding("sha256-16-0badf00d", PROMPT.num_tokens, b"\x01" * 36), "prompt_scheme"),
        (None, "prompt_mismatch"),
    ],
)
def test_a_write_is_pushed_only_into_blocks_announced_for_its_prompt(
    announced: PromptBinding | None, kind: str
) -> None:
    world = World(TransferMode.WRITE)
    producer, p_memory = world.start("producer#0", producer=True)
    consumer, d_memory = world.start("consumer#0", producer=False)
    p_memory.write(KV, (1, 2), 0)
    push = producer.service
    push.start_step(StepOrders(saves=[SaveOrder("p-1", "tx", ((1, 2),), None, PROMPT)]), 0.0)
    for layer in push.ctx.kv.names:
        push.save_layer(layer)
    push.end_forward()
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    load = consumer.service
    load.start_step(
        StepOrders(expect_writes=[ExpectWriteOrder("d-x", "tx", (4, 5), 0, peer, announced)]), 0.0
    )
    push.pump()
    report = load.finish_step()
    assert report.invalid_block_ids == {4, 5}
    assert report.failed_recving == {"d-x"}
    assert not d_memory.holds(KV, (4, 5), 0)
    assert push.ctx.counters.handoffs_refused == 1
    assert push.ctx.counters.failures_by_kind == {kind: 1}
    assert push.ctx.poster.stats.posts == 0
    verdicts = [
        s.message for s in producer.inner_channel.sent if isinstance(s.message, WriteFailed)
    ]
    assert len(verdicts) == 1
    assert kind in verdicts[0].reason
    if kind == "prompt_scheme":  # the decode learns what differs (PROMPT binds by tokens)
        assert "the prompt binding differs (prefill=tokens, decode=sha256-16-0badf00d)" in (
            verdicts[0].reason
        )
    # The refusal bound nothing: the announcement for the same prompt is pushed into, though
    # it comes in the step that also ends the refused request (its abort frees nothing then).
    genuine = ExpectWriteOrder("d-v", "tx", (6, 7), 0, peer, PROMPT)
    load.start_step(
        StepOrders(expect_writes=[genuine], abort_writes=[AbortWriteOrder("d-x", "tx")]), 0.0
    )
    push.pump()
    load.pump()
    report = load.finish_step()
    assert report.finished_recving == {"d-v"}
    assert report.invalid_block_ids == set()
    assert d_memory.holds(KV, (6, 7), 0)
