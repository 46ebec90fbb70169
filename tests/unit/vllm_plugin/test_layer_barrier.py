"""The device-side layer barrier of a layerwise READ, through the worker side and the consumer
service over in-memory adapters, the device a :class:`moriio.testing.fake_stream.FakeStream`.

A layer's gate opens only once every read of that layer is terminal, failed or timed out
too (and a failure is still reported in the step's load errors); ``wait_for_layer_load``
queues a device wait and returns without waiting on the host; a graph being captured gets
a wait for every layer whether or not a step is armed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from moriio.testing.fake_stream import BASE_ADDRESS, FakeStream
from support.worker_stacks import PRODUCER, worker_pair

pytest.importorskip("vllm")

from moriio.adapters.device.stream_gates import StreamGates
from moriio.config.settings import ConnectorSettings, LoadMode
from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.consumer.gate_book import GateBook
from moriio.domain.worker.service import WorkerService
from moriio.testing.handoffs import signed_read
from moriio.testing.inmemory import FakeClock
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST, Timing
from moriio.vllm_plugin import worker_side as worker_side_module
from moriio.vllm_plugin.worker_side import WorkerSide

pytestmark = pytest.mark.vllm

POLLS_TO_LAND = 5
READS = {"tx-1": ((1, 2), (3, 4)), "tx-2": ((5,), (6,))}  # transfer: (local, remote) blocks


class GatedSide(WorkerSide):
    """The connector's worker side over an in-memory service, with device layer gates."""

    def __init__(self, service: WorkerService, gates: StreamGates) -> None:
        settings = ConnectorSettings(mode=TransferMode.READ, load_mode=LoadMode.LAYERWISE)
        super().__init__(settings, None, None, tp_rank=0)  # type: ignore[arg-type]
        self._service = service
        self._gates = gates

    @property
    def service(self) -> WorkerService | None:
        return self._service


def _layer_holds(
    memory: KVMemory, layer: int, uid: int, blocks: tuple[int, ...], first: int
) -> bool:
    values = memory.expected(uid, first, len(blocks), layer)[0]
    return bool(np.array_equal(memory.buffer[layer][:, list(blocks)], values))


class Barrier:
    """A consumer with gates, a producer holding both transfers' KV, and the device."""

    def __init__(self, timing: Timing | None = None) -> None:
        self.clock = FakeClock()
        producer, consumer, (p_memory, d_memory) = worker_pair(
            TransferMode.READ, self.clock, timing or Timing(transfer_timeout=30.0)
        )
        self.producer, self.consumer = producer, consumer
        self.p_memory, self.d_memory = p_memory, d_memory
        consumer.inner_engine.complete_after_polls = POLLS_TO_LAND
        holds = []
        for uid, (tid, (_, remote)) in enumerate(READS.items(), start=1):
            p_memory.write(uid, remote, 0)
            holds.append(HoldOrder(f"p-{uid}", tid))
        producer.service.start_step(StepOrders(holds=holds), 0.0)
        self.stream = FakeStream(len(d_memory.layer_names))
        self.gates = StreamGates(self.stream, self.stream.words, BASE_ADDRESS, lambda: 0)
        service = consumer.service
        assert service.consumer is not None
        service.consumer.gates = GateBook(self.gates, list(d_memory.layer_names))
        self.side = GatedSide(service, self.gates)
        self.seen: dict[int, bool] = {}  # layer -> whether every read had landed when read

    def bind_reads(self) -> None:
        peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
        reads = [
            signed_read(ReadOrder(f"d-{uid}", tid, local, remote, peer, None))
            for uid, (tid, (local, remote)) in enumerate(READS.items(), start=1)
        ]
        self.side.bind(StepOrders(reads=reads))

    def forward(self) -> None:
        """The forward's attention layers: the hook, then a kernel reading the layer."""
        for index, layer in enumerate(self.d_memory.layer_names):
            self.side.wait_for_layer_load(layer)
            self.stream.kernel(self._reader(index))

    def _reader(self, layer: int) -> Callable[[], None]:
        def read() -> None:
            self.seen[layer] = all(
                _layer_holds(self.d_memory, layer, uid, local, 0)
                for uid, (local, _) in enumerate(READS.values(), start=1)
            )

        return read

    def pump_until_drained(self, rounds: int = 50) -> None:
        for _ in range(rounds):
            self.consumer.service.pump()
            self.clock.advance(0.001)
            if self.stream.run():
                return
        raise AssertionError("the device still waits")


def test_the_forward_waits_on_the_device_not_the_host() -> None:
    barrier = Barrier()
    barrier.bind_reads()
    barrier.side.start_load_kv()
    barrier.forward()
    layers = len(barrier.d_memory.layer_names)
    assert barrier.stream.waits_queued == layers
    assert not _layer_holds(barrier.d_memory, 0, 1, READS["tx-1"][0], 0)  # still in flight
    assert not barrier.stream.run()
    assert barrier.seen == {}
    barrier.pump_until_drained()
    assert barrier.seen == dict.fromkeys(range(layers), True)


def test_a_gate_opens_only_once_every_read_of_its_layer_ended() -> None:
    barrier = Barrier()
    barrier.consumer.inner_engine.jitter_polls = 4  # the reads land at different polls
    barrier.bind_reads()
    barrier.side.start_load_kv()
    barrier.forward()
    barrier.pump_until_drained()
    assert barrier.seen == dict.fromkeys(range(len(barrier.d_memory.layer_names)), True)
    report = barrier.side.finish_step()
    assert report.invalid_block_ids == set()


def test_the_step_report_waits_for_the_reads_and_names_a_timed_out_one() -> None:
    """A read that never lands times out: its gate opens (the device does not hang) and
    its blocks are this step's load errors."""
    barrier = Barrier(Timing(transfer_timeout=0.05))
    barrier.consumer.inner_engine.complete_after_polls = 10**9  # never lands
    barrier.bind_reads()
    barrier.side.start_load_kv()
    barrier.forward()
    assert not barrier.stream.run()
    report = barrier.side.finish_step()  # waits out the deadline on the fake clock
    lost = {*READS["tx-1"][0], *READS["tx-2"][0]}
    assert report.invalid_block_ids == lost
    barrier.pump_until_drained()  # the gates opened: the forward runs, on blocks reported bad
    assert len(barrier.seen) == len(barrier.d_memory.layer_names)


def test_a_failed_read_opens_its_gates_and_is_reported() -> None:
    barrier = Barrier()
    barrier.consumer.inner_engine.inject_failures(1)  # the first layer's batch of tx-1
    barrier.bind_reads()
    barrier.side.start_load_kv()
    barrier.forward()
    report = barrier.side.finish_step()
    assert set(READS["tx-1"][0]) <= report.invalid_block_ids
    barrier.pump_until_drained()
    assert len(barrier.seen) == len(barrier.d_memory.layer_names)


def test_a_step_without_reads_queues_no_wait() -> None:
    barrier = Barrier()
    barrier.side.bind(StepOrders())
    barrier.side.start_load_kv()
    barrier.forward()
    assert barrier.stream.waits_queued == 0
    assert barrier.stream.run()


def test_a_graph_being_captured_gets_every_layer_s_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """No metadata is bound while vLLM captures: the wait is captured anyway, and a replay
    with nothing to load passes the open gates."""
    barrier = Barrier()
    monkeypatch.setattr(worker_side_module, "is_capturing", lambda: True)
    assert barrier.side.captures_layer_waits()
    barrier.forward()
    assert barrier.stream.waits_queued == len(barrier.d_memory.layer_names)
    assert barrier.stream.run()
    monkeypatch.setattr(worker_side_module, "is_capturing", lambda: False)
    assert not barrier.side.captures_layer_waits()


def test_shutdown_opens_every_gate() -> None:
    barrier = Barrier()
    barrier.consumer.inner_engine.complete_after_polls = 10**9
    barrier.bind_reads()
    barrier.side.start_load_kv()
    barrier.forward()
    assert not barrier.stream.run()
    barrier.side.shutdown()
    assert barrier.stream.run()
