"""A WRITE producer with device KV posts a layer only once the device work before it ran.

The forward thread records a fence per layer and per forward end (never waiting on the
device); the worker's pump posts what its fences allow. Real in-memory workers copy the
bytes, so a layer written "late" (after its hook, before its fence) must still arrive whole.
"""

from __future__ import annotations

from moriio.domain.params.orders import ExpectWriteOrder, SaveOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.protocol.messages import WriteDone
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.producer.write_fences import (
    FencedEnd,
    FencedLayer,
    FencedSaves,
    HostFences,
)
from moriio.testing.fences import ManualFence, ManualFences
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.stack import HOST, Stack, Timing
from support.worker_stacks import PRODUCER, worker_stack

TIMING = Timing(transfer_timeout=30.0, defer_timeout=60.0, handshake_timeout=5.0)
PEER = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)


class Pair:
    """A WRITE producer with hand-driven fences, and the consumer it pushes to."""

    def __init__(self) -> None:
        clock = FakeClock()
        fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
        self.producer, self.p_memory = worker_stack(
            "producer#0", True, TransferMode.WRITE, clock, fabric, net, TIMING
        )
        self.consumer, self.d_memory = worker_stack(
            "consumer#0", False, TransferMode.WRITE, clock, fabric, net, TIMING
        )
        self.fences = ManualFences()
        self.producer.service.ctx.fences = self.fences
        self.layers = self.p_memory.layer_names

    def announce(self, tid: str, dest: tuple[int, ...]) -> None:
        order = ExpectWriteOrder(f"d-{tid}", tid, dest, 0, PEER, prompt=PROMPT)
        self.consumer.service.start_step(StepOrders(expect_writes=[order]), 0.0)
        self.producer.service.pump()  # the announcement and the handshake

    def save(self, tid: str, blocks: tuple[int, ...]) -> None:
        order = SaveOrder(f"p-{tid}", tid, (blocks,), None, prompt=PROMPT)
        self.producer.service.start_step(StepOrders(saves=[order]), 0.0)

    @property
    def posts(self) -> int:
        return self.producer.service.ctx.poster.stats.posts

    def verdicts(self) -> list[object]:
        sent = [s.message for s in self.producer.inner_channel.sent]
        return [m for m in sent if isinstance(m, WriteDone)]


def _started(pair: Pair) -> Stack:
    pair.p_memory.write(7, (3, 4), 0)
    pair.save("tx-1", (3, 4))
    pair.announce("tx-1", (1, 2))
    return pair.producer


def test_nothing_is_posted_before_its_fence_completes() -> None:
    pair = Pair()
    service = _started(pair).service
    service.save_layer(pair.layers[0])
    service.save_layer(pair.layers[1])
    service.end_forward()
    assert len(pair.fences.recorded) == 3  # one per layer, one for the forward's end
    pair.p_memory.poison((3, 4))  # the kernels have not written the KV yet
    for _ in range(3):
        service.pump()
    assert pair.posts == 0
    pair.p_memory.write(7, (3, 4), 0)  # the device work runs...
    pair.fences.recorded[0].done = True  # ...and the first layer's fence completes
    service.pump()
    assert pair.posts == 1
    assert pair.verdicts() == []  # the forward's end is still fenced
    pair.fences.complete()
    service.pump()
    assert pair.posts == 2
    service.pump()  # the writes complete: the verdict goes out
    assert len(pair.verdicts()) == 1
    pair.consumer.service.pump()
    assert pair.d_memory.holds(7, (1, 2), 0)  # the bytes written after the hooks arrived


def test_the_forward_thread_never_posts_or_pumps_with_device_fences() -> None:
    pair = Pair()
    service = _started(pair).service
    polls = service.ctx.poster.stats
    before = (polls.posts, pair.producer.inner_engine.polls)
    service.save_layer(pair.layers[0])
    service.end_forward()
    assert (polls.posts, pair.producer.inner_engine.polls) == before


def test_a_second_streams_layers_wait_for_that_streams_fence() -> None:
    pair = Pair()
    service = _started(pair).service
    service.save_layer(pair.layers[0])  # micro-batch 0's stream
    pair.fences.stream = "ubatch-1"
    service.save_layer(pair.layers[1])  # micro-batch 1's stream
    pair.fences.stream = "main"
    service.end_forward()
    pair.fences.complete(stream="main")
    service.pump()
    assert pair.posts == 1  # layer 1 waits for its own stream
    assert pair.verdicts() == []  # and the forward's end waits for layer 1
    pair.fences.complete(stream="ubatch-1")
    service.pump()
    assert pair.posts == 2
    service.pump()
    assert len(pair.verdicts()) == 1


def test_a_late_fence_never_posts_the_next_forwards_transfer() -> None:
    """Layers fenced in one forward are that forward's: a transfer ordered in the next step
    is posted only by the fences of the forward that computes it."""
    pair = Pair()
    service = _started(pair).service
    for layer in pair.layers:
        service.save_layer(layer)
    service.end_forward()
    pair.save("tx-2", (5, 6))  # the next step starts while the first forward still runs
    pair.announce("tx-2", (7, 8))
    first_forward = len(pair.fences.recorded)
    pair.fences.complete()
    service.pump()
    assert pair.posts == 2  # tx-1's two layers, none of tx-2
    for layer in pair.layers:
        service.save_layer(layer)
    service.end_forward()
    assert len(pair.fences.recorded) == first_forward + 3
    pair.fences.complete()
    service.pump()
    assert pair.posts == 4
    service.pump()
    assert len(pair.verdicts()) == 2


def test_no_fence_is_recorded_while_nothing_is_written() -> None:
    pair = Pair()
    service = pair.producer.service
    for layer in pair.layers:
        service.save_layer(layer)
    service.end_forward()
    assert pair.fences.recorded == []


def test_host_memory_posts_each_layer_at_its_hook_and_pumps_once_per_forward() -> None:
    """No fences: a layer is posted by its own hook, without a pump (the progress thread
    takes in what arrives meanwhile); the forward's end pumps once, and only with a write."""
    pair = Pair()
    service = pair.producer.service
    service.ctx.fences = HostFences()
    pumps: list[bool] = []
    pump = service.pump
    service.pump = lambda *, in_forward=False: (pumps.append(in_forward), pump())[1]  # type: ignore[method-assign]
    for layer in pair.layers:
        service.save_layer(layer)
    service.end_forward()
    assert (pair.posts, pumps) == (0, [])  # nothing live: nothing posted, nothing pumped
    _started(pair)
    pumps.clear()
    service.save_layer(pair.layers[0])
    assert (pair.posts, pumps) == (1, [])
    service.save_layer(pair.layers[1])
    service.end_forward()
    assert (pair.posts, len(pumps)) == (2, 1)
    service.pump()
    assert len(pair.verdicts()) == 1


def test_fenced_saves_keep_stream_order_and_end_after_their_layers() -> None:
    saves = FencedSaves()
    a0, a1, b0 = ManualFence("a", "a0"), ManualFence("a", "a1"), ManualFence("b", "b0")
    end = ManualFence("a", "end")
    saves.add_layer(0, "l0", a0)
    saves.add_layer(0, "l1", a1)
    saves.add_layer(0, "l2", b0)
    saves.add_end(0, end)
    a1.done = end.done = True  # queried out of order: a0 still runs
    assert saves.take_ready() == []
    a0.done = True
    assert saves.take_ready() == [FencedLayer(0, "l0", a0), FencedLayer(0, "l1", a1)]
    b0.done = True
    assert saves.take_ready() == [FencedLayer(0, "l2", b0), FencedEnd(0, end)]
    assert len(saves) == 0
