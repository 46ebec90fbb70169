"""Under FULL CUDA graphs the reads land before the forward: per-layer hooks never run."""

from __future__ import annotations

import pytest

from support.worker_stacks import PRODUCER, worker_stack

pytest.importorskip("vllm")

from moriio.config.settings import ConnectorSettings
from moriio.domain.wire.modes import TransferMode
from moriio.domain.wire.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.wire.transfer_params import PeerEndpoint
from moriio.domain.worker.service import WorkerService
from moriio.sim.config import SimClock
from moriio.sim.memory import KVMemory
from moriio.sim.stack import HOST
from moriio.testing.inmemory import InMemoryFabric, InMemoryNetwork
from moriio.vllm_plugin.worker_side import WorkerSide

pytestmark = pytest.mark.vllm

POLLS_TO_LAND = 5  # a read completes on its fifth poll: it is in flight after posting


class ServedSide(WorkerSide):
    """The worker side of the connector over a given (in-memory) worker service."""

    def __init__(self, service: WorkerService, *, full_cudagraphs: bool) -> None:
        settings = ConnectorSettings(mode=TransferMode.READ)
        super().__init__(settings, None, None, tp_rank=0, full_cudagraphs=full_cudagraphs)  # type: ignore[arg-type]
        self._service = service

    @property
    def service(self) -> WorkerService | None:
        return self._service


def _bound_read(full_cudagraphs: bool) -> tuple[ServedSide, KVMemory, tuple[object, ...]]:
    """A consumer worker side bound to a step that reads blocks 3, 4 into 1, 2.

    The last item keeps the producer (and the memory the reads copy from) alive.
    """
    clock = SimClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    producer, p_memory = worker_stack("producer#0", True, TransferMode.READ, clock, fabric, net)
    consumer, d_memory = worker_stack("consumer#0", False, TransferMode.READ, clock, fabric, net)
    consumer.inner_engine.complete_after_polls = POLLS_TO_LAND
    p_memory.write(9, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    side = ServedSide(consumer.service, full_cudagraphs=full_cudagraphs)
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    side.bind(StepOrders(reads=[ReadOrder("d-1", "tx-1", (1, 2), (3, 4), peer, None)]))
    return side, d_memory, (producer, p_memory)


def test_full_graphs_wait_for_every_read_before_the_forward() -> None:
    side, d_memory, _producer = _bound_read(full_cudagraphs=True)
    side.start_load_kv()
    assert d_memory.holds(9, (1, 2), 0)  # before the graph replays, with no layer hook run
    service = side.service
    assert service is not None
    assert service.consumer is not None
    assert not service.consumer.has_live_reads()
    side.wait_for_layer_load(d_memory.layer_names[0])  # a no-op inside a full graph
    assert side.finish_step().invalid_block_ids == set()


def test_piecewise_graphs_wait_per_layer_instead() -> None:
    """Control: the reads are still in flight after ``start_load_kv`` when layers wait."""
    side, d_memory, _producer = _bound_read(full_cudagraphs=False)
    side.start_load_kv()
    assert not d_memory.holds(9, (1, 2), 0)
    for layer in d_memory.layer_names:
        side.wait_for_layer_load(layer)
    assert d_memory.holds(9, (1, 2), 0)
    assert side.finish_step().invalid_block_ids == set()
