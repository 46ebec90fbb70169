"""Worker progress while the engine does not step: its own thread drives the service."""

from __future__ import annotations

import threading
import time

import pytest

from moriio.domain.worker.progress import WorkerProgress
from moriio.domain.worker.service import WorkerService
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import Stack, Timing
from support.worker_stacks import write_announced_to_an_idle_prefill

# Deadlines far away on the fake clock: only the progress thread can end the transfer.
TIMING = Timing(transfer_timeout=30.0, defer_timeout=60.0, handshake_timeout=5.0)


def _prefill_done_then_idle() -> tuple[Stack, Stack, tuple[KVMemory, KVMemory]]:
    """The producer computed its KV and sealed the transfer, then its engine stopped stepping;
    only then does the consumer announce where the KV must go."""
    return write_announced_to_an_idle_prefill(TIMING)


def _landed(consumer: WorkerService, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        report = consumer.finish_step()
        if report.finished_recving:
            assert report.failed_recving == set()
            return True
        time.sleep(0.005)
    return False


def test_an_idle_producer_still_serves_a_late_write() -> None:
    producer, consumer, (_, d_memory) = _prefill_done_then_idle()
    progress = WorkerProgress(producer.service, busy_interval=0.001, idle_wait=0.01)
    progress.start()
    try:
        assert _landed(consumer.service, within=10.0)
    finally:
        progress.stop()
    assert not progress.alive
    assert d_memory.holds(7, (1, 2), 0)
    with progress.lock:  # what the thread saw is reported at the engine's next step
        assert producer.service.finish_step().finished_sending == {"p-1"}
    assert progress.errors == 0


def test_without_progress_the_write_waits_for_the_next_engine_step() -> None:
    producer, consumer, (_, d_memory) = _prefill_done_then_idle()
    assert not _landed(consumer.service, within=0.3)
    assert not d_memory.holds(7, (1, 2), 0)
    producer.service.finish_step()  # the step an idle engine never takes
    assert _landed(consumer.service, within=1.0)


class _FailingOnce(WorkerService):
    """A service whose first pump raises (a bug, a hostile frame the codec missed...)."""

    def __init__(self, inner: WorkerService) -> None:
        self.__dict__.update(inner.__dict__)
        self.pumped = threading.Event()
        self._raised = False

    def pump(self) -> None:
        if not self._raised:
            self._raised = True
            raise RuntimeError("boom")
        super().pump()
        self.pumped.set()


def test_a_failing_round_is_logged_and_progress_continues(
    caplog: pytest.LogCaptureFixture,
) -> None:
    producer, _, _ = _prefill_done_then_idle()
    service = _FailingOnce(producer.service)
    progress = WorkerProgress(service, busy_interval=0.001, idle_wait=0.01)
    progress.start()
    try:
        assert service.pumped.wait(5.0)
    finally:
        progress.stop()
    assert progress.errors == 1
    assert "worker progress round failed" in caplog.text
    assert "RuntimeError: boom" in caplog.text  # the traceback reaches the handler
    assert "worker='127.0.0.1:" in caplog.text  # the worker's control address is bound


def test_intervals_must_be_positive() -> None:
    producer, _, _ = _prefill_done_then_idle()
    with pytest.raises(ValueError, match="busy_interval"):
        WorkerProgress(producer.service, busy_interval=0.0)


class _Recording(WorkerService):
    """A service that records, per thread, the order of device binding and pumps."""

    def __init__(self, inner: WorkerService, events: list[tuple[str, str]]) -> None:
        self.__dict__.update(inner.__dict__)
        self.events = events
        self.pumped = threading.Event()

    def pump(self) -> None:
        self.events.append(("pump", threading.current_thread().name))
        super().pump()
        self.pumped.set()


def test_the_progress_thread_binds_the_device_before_it_touches_the_engine() -> None:
    producer, _, _ = _prefill_done_then_idle()
    events: list[tuple[str, str]] = []
    producer.service.ctx.bind_device = lambda: events.append(
        ("bind", threading.current_thread().name)
    )
    service = _Recording(producer.service, events)
    progress = WorkerProgress(service, busy_interval=0.001, idle_wait=0.01)
    progress.start()
    try:
        assert service.pumped.wait(5.0)
    finally:
        progress.stop()
    assert events[0] == ("bind", "moriio-progress")
    assert [e for e in events if e[0] == "bind"] == [("bind", "moriio-progress")]
    assert {thread for _, thread in events} == {"moriio-progress"}
