"""A decode's step that computes nothing while loads are live waits for one to finish (bounded
by ``idle_step_wait``) instead of returning at once: vLLM steps such an engine again 1 ms after
each return, which spins a core for as long as its requests wait for their KV."""

from __future__ import annotations

import threading
import time

import pytest

from support.worker_stacks import worker_stack, write_announced_to_an_idle_prefill

pytest.importorskip("vllm")

from moriio.config.settings import ConnectorSettings
from moriio.domain.params.orders import HoldOrder, StepOrders
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.progress import WorkerProgress
from moriio.domain.worker.service import WorkerService
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import Stack, Timing

pytestmark = pytest.mark.vllm

# Deadlines far away on the fake clock: a transfer ends only by landing.
TIMING = Timing(transfer_timeout=30.0, defer_timeout=60.0, handshake_timeout=5.0)
LONG_WAIT = 20.0  # far above any landing here: a step returning before it was woken


class ProgressedSide:
    """The connector's worker side over an in-memory service, with its progress thread."""

    def __init__(self, service: WorkerService, idle_step_wait: float) -> None:
        from moriio.vllm_plugin.worker_side import WorkerSide

        settings = ConnectorSettings(mode=TransferMode.WRITE, idle_step_wait=idle_step_wait)
        side = WorkerSide(settings, None, None, tp_rank=0)  # type: ignore[arg-type]
        side._runtime = _Runtime(service)  # type: ignore[assignment]
        side._progress = WorkerProgress(service, busy_interval=0.001, idle_wait=0.01)
        side._progress.start()
        self.side = side

    def stop(self) -> None:
        assert self.side.progress is not None
        self.side.progress.stop()


class _Runtime:
    def __init__(self, service: WorkerService) -> None:
        self.service = service


def _write_expected() -> tuple[Stack, Stack, tuple[KVMemory, KVMemory]]:
    """The decode announced where the KV goes; the prefill posts the write at its next step."""
    return write_announced_to_an_idle_prefill(TIMING)


def _idle_step(served: ProgressedSide, *, computes: bool) -> tuple[set[str], float]:
    served.side.bind(StepOrders(), computes=computes)
    started = time.monotonic()
    report = served.side.finish_step()
    return report.finished_recving, time.monotonic() - started


def _idle_step_as_the_prefill_steps(
    served: ProgressedSide, producer: Stack, *, computes: bool
) -> tuple[set[str], float]:
    """A step of the decode, begun 0.3 s before the prefill's next step posts the write."""

    def step() -> None:
        time.sleep(0.3)
        producer.service.finish_step()

    poster = threading.Thread(target=step)
    poster.start()
    try:
        return _idle_step(served, computes=computes)
    finally:
        poster.join()


def test_a_step_that_computes_nothing_returns_when_the_write_lands() -> None:
    producer, consumer, _memory = _write_expected()
    served = ProgressedSide(consumer.service, idle_step_wait=LONG_WAIT)
    try:
        landed, waited = _idle_step_as_the_prefill_steps(served, producer, computes=False)
    finally:
        served.stop()
    assert landed == {"d-1"}  # reported by the step that waited, not a later one
    assert waited < LONG_WAIT  # woken by the landing


@pytest.mark.parametrize(("computes", "wait"), [(True, LONG_WAIT), (False, 0.0)])
def test_a_computing_step_or_a_wait_of_zero_returns_at_once(computes: bool, wait: float) -> None:
    producer, consumer, _memory = _write_expected()
    served = ProgressedSide(consumer.service, idle_step_wait=wait)
    try:
        landed, _ = _idle_step_as_the_prefill_steps(served, producer, computes=computes)
        later = set[str]()
        for _ in range(500):  # the landing is reported by a later step
            later, _ = _idle_step(served, computes=True)
            if later:
                break
            time.sleep(0.01)
    finally:
        served.stop()
    assert landed == set()
    assert later == {"d-1"}


def test_with_nothing_live_a_step_that_computes_nothing_does_not_wait() -> None:
    producer, consumer, _memory = _write_expected()
    consumer.service.start_step(StepOrders(), 0.0)
    served = ProgressedSide(consumer.service, idle_step_wait=LONG_WAIT)
    try:
        for _ in range(500):  # let the write land and be reported: nothing is live after
            landed, _ = _idle_step(served, computes=True)
            if landed or consumer.service.num_live == 0:
                break
            producer.service.finish_step()
            time.sleep(0.01)
        assert consumer.service.num_live == 0
        landed, waited = _idle_step(served, computes=False)
    finally:
        served.stop()
    assert landed == set()
    assert waited < LONG_WAIT


def test_the_wait_is_bounded_when_nothing_lands() -> None:
    _producer, consumer, _memory = _write_expected()  # the prefill never steps again
    served = ProgressedSide(consumer.service, idle_step_wait=0.2)
    try:
        landed, waited = _idle_step(served, computes=False)
    finally:
        served.stop()
    assert landed == set()
    assert waited >= 0.2
    assert consumer.service.num_live == 1  # still expected: its deadline ends it, not the step


def test_a_prefill_holding_a_hand_off_does_not_wait() -> None:
    """Its next request would wait with it: only a decode's loads make a step wait."""
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    producer, _memory = worker_stack("producer#0", True, TransferMode.READ, clock, fabric, net)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    assert producer.service.num_live == 1  # held until a decode reads and releases it
    served = ProgressedSide(producer.service, idle_step_wait=LONG_WAIT)
    try:
        sent, waited = _idle_step(served, computes=False)
    finally:
        served.stop()
    assert sent == set()
    assert waited < LONG_WAIT
