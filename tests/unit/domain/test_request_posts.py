"""A request as one post between spans: READ and WRITE, against the per-layer path.

Workers over the in-memory adapters whose KV buffers are named as the layers' storage (as
vLLM's are): an asynchronous READ, and a WRITE whose layers no hook posted, move every
layer in one batch against each side's whole buffer; layer-wise loads and saves post layer
by layer; a memory without spans posts per layer. Bytes are checked every time.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.params.orders import (
    ExpectWriteOrder,
    HoldOrder,
    ReadOrder,
    SaveOrder,
    StepOrders,
)
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.poster import PostResult
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Stack, Timing, build_stack
from support.worker_stacks import CONSUMER, PRODUCER

LAYERS, BLOCKS = 3, 16


def _pair(
    mode: TransferMode, *, spans: tuple[bool, bool] = (True, True)
) -> tuple[Stack, Stack, KVMemory, KVMemory, list[PostResult]]:
    """A producer and a consumer; last, the batches the side that posts observed."""
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    stacks, memories = [], []
    for name, producer, with_spans in (
        ("producer#0", True, spans[0]),
        ("consumer#0", False, spans[1]),
    ):
        memory = KVMemory(LAYERS, BLOCKS, 4, spans=with_spans)
        stacks.append(
            build_stack(
                name=name,
                mode=mode,
                is_producer=producer,
                endpoint=PRODUCER if producer else CONSUMER,
                memory=memory,
                clock=clock,
                fabric=fabric,
                network=net,
                timing=Timing(),
                rng=random.Random(3),
                engine_plan=EngineFaultPlan(),
                channel_plan=ChannelFaultPlan(),
            )
        )
        memories.append(memory)
    observed: list[PostResult] = []

    def observe(results: Sequence[PostResult]) -> None:
        observed.extend(results)

    poster = stacks[1] if mode is TransferMode.READ else stacks[0]
    poster.service.observe_batches(observe)
    return stacks[0], stacks[1], memories[0], memories[1], observed


def _read(load_async: bool, spans: tuple[bool, bool] = (True, True)) -> list[PostResult]:
    producer, consumer, p_memory, d_memory, observed = _pair(TransferMode.READ, spans=spans)
    p_memory.write(9, (3, 4, 9), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    order = signed_read(
        ReadOrder("d-1", "tx-1", (1, 2, 7), (3, 4, 9), peer, None, load_async=load_async)
    )
    consumer.service.start_step(StepOrders(reads=[order]), 0.0)
    for layer in d_memory.layer_names:
        consumer.service.wait_for_layer(layer)
    report = consumer.service.finish_step()
    for _ in range(5):
        if report.finished_recving:
            break
        consumer.service.start_step(StepOrders(), 0.0)
        report = consumer.service.finish_step()
    assert d_memory.holds(9, (1, 2, 7), 0)
    assert d_memory.dirty_blocks([b for b in range(BLOCKS) if b not in (1, 2, 7)]) == []
    if load_async:
        assert report.finished_recving == {"d-1"}
    assert not report.failed_recving
    return observed


def test_an_asynchronous_read_moves_every_layer_in_one_batch_between_the_spans() -> None:
    (batch,) = _read(load_async=True)
    assert batch.ok
    assert batch.request.covered == KVMemory(LAYERS, BLOCKS, 4).layer_names
    # K and V runs of each layer: (1, 2) <- (3, 4) is one run, 7 <- 9 another, per half.
    assert batch.request.plan.num_descriptors == LAYERS * 2 * 2


def test_a_layerwise_read_posts_each_layer_alone() -> None:
    batches = _read(load_async=False)
    assert [b.request.covered for b in batches] == [
        (name,) for name in KVMemory(LAYERS, BLOCKS, 4).layer_names
    ]


def test_a_peer_without_spans_is_read_layer_by_layer() -> None:
    for spans in ((True, False), (False, True)):
        batches = _read(load_async=True, spans=spans)
        assert len(batches) == LAYERS, spans


def _write(hooks: bool) -> list[PostResult]:
    producer, consumer, p_memory, d_memory, observed = _pair(TransferMode.WRITE)
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    consumer.service.start_step(
        StepOrders(expect_writes=[ExpectWriteOrder("d-1", "tx-1", (1, 2), 0, peer, prompt=PROMPT)]),
        0.0,
    )
    consumer.service.finish_step()
    p_memory.write(7, (3, 4), 0)
    producer.service.start_step(
        StepOrders(saves=[SaveOrder("p-1", "tx-1", ((3, 4),), None, prompt=PROMPT)]), 0.0
    )
    if hooks:
        for layer in p_memory.layer_names:
            producer.service.save_layer(layer)
    producer.service.end_forward()
    producer.service.finish_step()
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    sent = producer.service.finish_step().finished_sending
    received = set()
    for _ in range(5):
        consumer.service.start_step(StepOrders(), 0.0)
        received |= consumer.service.finish_step().finished_recving
    assert (sent, received) == ({"p-1"}, {"d-1"})
    assert d_memory.holds(7, (1, 2), 0)
    return observed


def test_a_write_no_layer_hook_posted_moves_as_one_batch() -> None:
    (batch,) = _write(hooks=False)
    assert batch.ok
    assert batch.request.covered == KVMemory(LAYERS, BLOCKS, 4).layer_names


def test_a_write_posted_at_each_layer_hook_stays_layer_by_layer() -> None:
    batches = _write(hooks=True)
    assert [b.request.covered for b in batches] == [
        (name,) for name in KVMemory(LAYERS, BLOCKS, 4).layer_names
    ]
