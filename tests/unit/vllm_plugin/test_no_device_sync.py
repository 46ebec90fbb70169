"""vLLM calls ``save_kv_layer`` and ``wait_for_save`` in every forward of every engine: none
of them may wait for the device. Only a WRITE producer records fences, and only while a
transfer is live."""

from __future__ import annotations

from unittest.mock import MagicMock

import pytest
from pytest_mock import MockerFixture

from support.worker_stacks import worker_stack

pytest.importorskip("vllm")

import torch

from moriio.config.settings import ConnectorSettings
from moriio.domain.params.orders import SaveOrder, StepOrders
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import WorkerService
from moriio.testing.fences import ManualFences
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.vllm_plugin.worker_side import WorkerSide

pytestmark = pytest.mark.vllm


class ServedSide(WorkerSide):
    """The worker side of the connector over a given (in-memory) worker service."""

    def __init__(self, service: WorkerService, mode: TransferMode) -> None:
        super().__init__(ConnectorSettings(mode=mode), None, None, tp_rank=0)  # type: ignore[arg-type]
        self._service = service

    @property
    def service(self) -> WorkerService | None:
        return self._service


@pytest.fixture
def device_waits(mocker: MockerFixture) -> list[MagicMock]:
    """A device is present, and every torch call that waits for it (or finds its stream) is
    a mock that fails the test when called."""
    mocker.patch.object(torch.cuda, "is_available", return_value=True)
    modules = [torch.cuda, *([torch.accelerator] if hasattr(torch, "accelerator") else [])]
    return [
        mocker.patch.object(
            module,
            name,
            side_effect=AssertionError(f"{module.__name__}.{name} called on the forward thread"),
        )
        for module in modules
        for name in ("synchronize", "current_stream")
    ]


def called(mocks: list[MagicMock]) -> list[MagicMock]:
    return [mock for mock in mocks if mock.called]


def _side(producer: bool, mode: TransferMode) -> tuple[ServedSide, ManualFences, list[str]]:
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    stack, memory = worker_stack("worker#0", producer, mode, clock, fabric, net)
    fences = ManualFences()
    stack.service.ctx.fences = fences
    side = ServedSide(stack.service, mode)
    side._on_device = True  # the KV caches live in device memory
    return side, fences, memory.layer_names


def _forward(side: ServedSide, layers: list[str]) -> None:
    side.start_load_kv()
    for layer in layers:
        side.wait_for_layer_load(layer)
        side.save_kv_layer(layer)
    side.wait_for_save()
    side.finish_step()


@pytest.mark.parametrize(
    ("producer", "mode"),
    [
        (True, TransferMode.READ),
        (False, TransferMode.READ),
        (False, TransferMode.WRITE),
    ],
    ids=["read-producer", "read-consumer", "write-consumer"],
)
def test_read_roles_and_decode_engines_never_synchronise(
    producer: bool, mode: TransferMode, device_waits: list[MagicMock]
) -> None:
    side, fences, layers = _side(producer, mode)
    for _ in range(3):
        _forward(side, layers)
    assert fences.recorded == []
    assert called(device_waits) == []


def test_a_write_producer_fences_each_layer_and_never_waits(device_waits: list[MagicMock]) -> None:
    side, fences, layers = _side(True, TransferMode.WRITE)
    side.bind(StepOrders(saves=[SaveOrder("p-1", "tx-1", ((3, 4),), None, prompt=PROMPT)]))
    _forward(side, layers)
    assert len(fences.recorded) == len(layers) + 1  # a fence per layer and the forward's end
    assert all(not f.done for f in fences.recorded)  # the forward returned with work queued
    assert called(device_waits) == []


def test_a_write_producer_without_transfers_records_nothing(device_waits: list[MagicMock]) -> None:
    side, fences, layers = _side(True, TransferMode.WRITE)
    _forward(side, layers)
    assert fences.recorded == []
    assert called(device_waits) == []
