"""Worker progress while the engine does not step: its own thread drives the service."""

from __future__ import annotations

import threading
import time

import pytest

from moriio.domain.protocol.messages import Release
from moriio.domain.worker.progress import Need, WorkerProgress
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


class _Switched(WorkerService):
    """A service whose live work is set by the test: none, waiting on messages, or polled."""

    def __init__(self, inner: WorkerService) -> None:
        self.__dict__.update(inner.__dict__)
        self.need = Need.NOTHING

    def needs_polling(self) -> bool:
        return self.need is Need.POLL

    def needs_progress(self) -> bool:
        return self.need is not Need.NOTHING


def _settled(progress: WorkerProgress, service: _Switched) -> int:
    """The pumps so far, once the thread waits for what ``service`` needs."""
    deadline = time.monotonic() + 10.0
    while progress._waiting is not service.need:  # set by the thread, under the lock
        assert time.monotonic() < deadline, "the progress thread never went back to waiting"
        time.sleep(0.005)
    with progress.lock:
        return progress.pumps


def _pumps_grow(progress: WorkerProgress, beyond: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if progress.pumps > beyond:
            return True
        time.sleep(0.005)
    return False


def test_with_nothing_live_the_thread_sleeps_until_a_message_arrives() -> None:
    producer, consumer, _ = _prefill_done_then_idle()
    service = _Switched(producer.service)
    # idle_wait would pump 100 times a second; only messages may wake a thread with nothing
    # live (idle_block: far beyond this test).
    progress = WorkerProgress(service, busy_interval=0.001, idle_wait=0.01, idle_block=3600.0)
    progress.start()
    try:
        pumps = _settled(progress, service)
        time.sleep(0.3)
        assert progress.pumps == pumps, "the thread woke with nothing live and no message"
        channel = consumer.service.ctx.channel
        channel.send(service.ctx.channel.address, Release("nobody-1", consumer_tp_size=1))
        assert _pumps_grow(progress, pumps), "a message did not wake the idle thread"
    finally:
        progress.stop()
    assert not progress.alive


def test_a_nudge_wakes_a_thread_that_waits_longer_than_new_work_allows() -> None:
    producer, _, _ = _prefill_done_then_idle()
    service = _Switched(producer.service)
    progress = WorkerProgress(service, busy_interval=0.001, idle_wait=3600.0, idle_block=3600.0)
    progress.start()
    try:
        for need in (Need.MESSAGE, Need.POLL):
            pumps = _settled(progress, service)
            with progress.lock:  # a hook made work live
                service.need = need
                progress.nudge()
            assert _pumps_grow(progress, pumps), f"no pump after work needing {need.name}"
        pumps = _settled(progress, service)
        assert _pumps_grow(progress, pumps + 5), "polled work was not polled"
        with progress.lock:
            service.need = Need.NOTHING
        wakes = progress.wakes
        with progress.lock:
            progress.nudge()  # nothing needs it: no wake
        assert progress.wakes == wakes
    finally:
        progress.stop()
    assert not progress.alive
