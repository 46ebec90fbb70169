"""vLLM calls ``save_kv_layer`` and ``wait_for_save`` in every forward of every engine: none
of them may wait for the device. Only a WRITE producer records fences, and only while a
transfer is live."""

from __future__ import annotations

import pytest

from support.worker_stacks import worker_stack

pytest.importorskip("vllm")

import torch

from moriio.config.settings import ConnectorSettings
from moriio.domain.wire.modes import TransferMode
from moriio.domain.wire.orders import SaveOrder, StepOrders
from moriio.domain.worker.service import WorkerService
from moriio.testing.fences import ManualFences
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
def no_device_waits(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A device is present, and every torch call that waits for it (or finds its stream)
    fails the test."""
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def forbidden(name: str) -> object:
        def call(*args: object, **kwargs: object) -> None:
            calls.append(name)
            raise AssertionError(f"{name} called on the forward thread")

        return call

    for name in ("synchronize", "current_stream"):
        monkeypatch.setattr(torch.cuda, name, forbidden(f"torch.cuda.{name}"))
        if hasattr(torch, "accelerator"):
            monkeypatch.setattr(torch.accelerator, name, forbidden(f"torch.accelerator.{name}"))
    return calls


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
    producer: bool, mode: TransferMode, no_device_waits: list[str]
) -> None:
    side, fences, layers = _side(producer, mode)
    for _ in range(3):
        _forward(side, layers)
    assert fences.recorded == []
    assert no_device_waits == []


def test_a_write_producer_fences_each_layer_and_never_waits(no_device_waits: list[str]) -> None:
    side, fences, layers = _side(True, TransferMode.WRITE)
    side.bind(StepOrders(saves=[SaveOrder("p-1", "tx-1", (3, 4), None)]))
    _forward(side, layers)
    assert len(fences.recorded) == len(layers) + 1  # a fence per layer and the forward's end
    assert all(not f.done for f in fences.recorded)  # the forward returned with work queued
    assert no_device_waits == []


def test_a_write_producer_without_transfers_records_nothing(no_device_waits: list[str]) -> None:
    side, fences, layers = _side(True, TransferMode.WRITE)
    _forward(side, layers)
    assert fences.recorded == []
    assert no_device_waits == []
