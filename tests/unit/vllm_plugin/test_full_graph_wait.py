"""In a batch that replays a FULL CUDA graph the reads land before the forward (per-layer
hooks never run); eager and piecewise batches wait layer by layer. The mode is read per
forward, from vLLM's forward context."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from support.worker_stacks import PRODUCER, worker_stack

pytest.importorskip("vllm")

from moriio.config.settings import ConnectorSettings
from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import WorkerService
from moriio.testing.handoffs import signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import HOST
from moriio.vllm_plugin.support import forward_is_full_graph
from moriio.vllm_plugin.worker_side import WorkerSide

pytestmark = pytest.mark.vllm

POLLS_TO_LAND = 5  # a read completes on its fifth poll: it is in flight after posting


class ServedSide(WorkerSide):
    """The worker side of the connector over a given (in-memory) worker service."""

    def __init__(self, service: WorkerService, *, full_graph: Callable[[], bool]) -> None:
        settings = ConnectorSettings(mode=TransferMode.READ)
        super().__init__(settings, None, None, tp_rank=0, full_graph=full_graph)  # type: ignore[arg-type]
        self._service = service

    @property
    def service(self) -> WorkerService | None:
        return self._service


def _bound_read(
    full_graph: Callable[[], bool], *, load_async: bool = False
) -> tuple[ServedSide, KVMemory, tuple[object, ...]]:
    """A consumer worker side bound to a step that reads blocks 3, 4 into 1, 2.

    The last item keeps the producer (and the memory the reads copy from) alive.
    """
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    producer, p_memory = worker_stack("producer#0", True, TransferMode.READ, clock, fabric, net)
    consumer, d_memory = worker_stack("consumer#0", False, TransferMode.READ, clock, fabric, net)
    consumer.inner_engine.complete_after_polls = POLLS_TO_LAND
    p_memory.write(9, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    side = ServedSide(consumer.service, full_graph=full_graph)
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    read = signed_read(ReadOrder("d-1", "tx-1", (1, 2), (3, 4), peer, None, load_async=load_async))
    side.bind(StepOrders(reads=[read]))
    return side, d_memory, (producer, p_memory)


def test_full_graphs_wait_for_every_read_before_the_forward() -> None:
    side, d_memory, _producer = _bound_read(full_graph=lambda: True)
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
    side, d_memory, _producer = _bound_read(full_graph=lambda: False)
    side.start_load_kv()
    assert not d_memory.holds(9, (1, 2), 0)
    for layer in d_memory.layer_names:
        side.wait_for_layer_load(layer)
    assert d_memory.holds(9, (1, 2), 0)
    assert side.finish_step().invalid_block_ids == set()


@contextmanager
def _forward(mode: object) -> Iterator[None]:
    """A vLLM forward context whose batch runs in cudagraph runtime ``mode``."""
    from vllm.forward_context import ForwardContext, override_forward_context

    context = ForwardContext(
        no_compile_layers={},
        attn_metadata={},
        slot_mapping={},
        cudagraph_runtime_mode=mode,  # type: ignore[arg-type]
    )
    with override_forward_context(context):
        yield


def test_the_graph_mode_is_read_from_each_forward() -> None:
    from vllm.config import CUDAGraphMode

    assert forward_is_full_graph() is False  # no forward running
    with _forward(CUDAGraphMode.FULL):
        assert forward_is_full_graph() is True
    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE):
        with _forward(mode):
            assert forward_is_full_graph() is False


@pytest.mark.parametrize("full", [True, False])
def test_a_piecewise_batch_keeps_layerwise_waits_under_full_and_piecewise(full: bool) -> None:
    """FULL_AND_PIECEWISE (vLLM's default) replays full graphs for some batches only: the
    wait follows the batch, not the configured mode."""
    from vllm.config import CUDAGraphMode

    side, d_memory, _producer = _bound_read(full_graph=forward_is_full_graph)
    with _forward(CUDAGraphMode.FULL if full else CUDAGraphMode.PIECEWISE):
        side.start_load_kv()
        assert d_memory.holds(9, (1, 2), 0) is full
        for layer in d_memory.layer_names:
            side.wait_for_layer_load(layer)
    assert d_memory.holds(9, (1, 2), 0)
    assert side.finish_step().invalid_block_ids == set()


@pytest.mark.parametrize("load_async", [True, False])
def test_a_layer_with_nothing_to_wait_for_costs_no_lock_and_no_graph_check(
    load_async: bool,
) -> None:
    """Once the step's orders are applied, only a live layerwise read makes a layer wait."""
    checks: list[None] = []

    def full_graph() -> bool:
        checks.append(None)
        return False

    side, d_memory, _producer = _bound_read(full_graph, load_async=load_async)
    side.start_load_kv()
    checks.clear()  # start_load_kv asks once per forward
    for layer in d_memory.layer_names:
        side.wait_for_layer_load(layer)
    # A layerwise read still landed before the forward; an async one lands later.
    assert d_memory.holds(9, (1, 2), 0) is not load_async
    checked = len(checks)
    assert (checked == 0) is load_async  # an async read never holds a layer up
    for layer in d_memory.layer_names:  # the read has ended: the next forward skips it all
        side.wait_for_layer_load(layer)
    assert len(checks) == checked
