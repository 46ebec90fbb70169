"""Worker and scheduler-side counters reach vLLM's stats (log line and Prometheus)."""

from __future__ import annotations

import pytest

from support.worker_stacks import worker_stack

pytest.importorskip("vllm")

from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import WorkerService
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.vllm_plugin.stats import StatsTracker

pytestmark = pytest.mark.vllm


def _worker() -> WorkerService:
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    return worker_stack("producer#0", True, TransferMode.WRITE, clock, fabric, net)[0].service


def test_worker_counters_are_reported_once_per_interval() -> None:
    worker, tracker = _worker(), StatsTracker()
    worker.ctx.counters.early_blocks_evicted += 2
    worker.ctx.counters.releases_refused += 3
    stats = tracker.collect(worker.take_stats())
    assert stats is not None
    reduced = stats.reduce()
    assert reduced["early_blocks_evicted"] == 2
    assert reduced["releases_refused"] == 3
    assert tracker.collect(worker.take_stats()) is None  # nothing new since


def test_rejected_params_are_reported_by_the_scheduler_side() -> None:
    tracker = StatsTracker()
    assert tracker.collect(None) is None
    tracker.rejected_params = 2
    stats = tracker.collect(None)
    assert stats is not None
    assert stats.reduce()["rejected_params"] == 2
    assert tracker.collect(None) is None
    tracker.rejected_params = 3
    stats = tracker.collect(None)
    assert stats is not None
    assert stats.data["rejected_params"] == 1


def test_fencing_counters_are_exported() -> None:
    worker, tracker = _worker(), StatsTracker()
    counters = worker.ctx.counters
    counters.late_announcements += 1
    counters.quarantined_blocks += 4
    counters.late_completions += 2
    stats = tracker.collect(worker.take_stats())
    assert stats is not None
    reduced = stats.reduce()
    assert reduced["late_announcements"] == 1
    assert reduced["quarantined_blocks"] == 4
    assert reduced["late_completions"] == 2
