"""Worker and scheduler-side counters reach vLLM's stats (log line and Prometheus)."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm")

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.adapters.inmemory import InMemoryFabric, InMemoryNetwork
from moriio.domain.orders import TransferMode
from moriio.domain.worker import WorkerService
from moriio.sim.config import SimClock
from moriio.sim.memory import KVMemory
from moriio.sim.stack import Endpoint, Timing, build_stack
from moriio.vllm_plugin.stats import StatsTracker

pytestmark = pytest.mark.vllm


def _worker() -> WorkerService:
    clock = SimClock()
    return build_stack(
        name="producer#0",
        mode=TransferMode.WRITE,
        is_producer=True,
        endpoint=Endpoint(handshake_port=7000, notify_port=7100),
        memory=KVMemory(1, 4, 4),
        clock=clock,
        fabric=InMemoryFabric(),
        network=InMemoryNetwork(clock),
        timing=Timing(),
        rng=random.Random(1),
        engine_plan=EngineFaultPlan(),
        channel_plan=ChannelFaultPlan(),
    ).service


def test_worker_counters_are_reported_once_per_interval() -> None:
    worker, tracker = _worker(), StatsTracker()
    worker.ctx.counters.early_blocks_evicted += 2
    worker.ctx.counters.releases_refused += 3
    stats = tracker.collect(worker)
    assert stats is not None
    reduced = stats.reduce()
    assert reduced["early_blocks_evicted"] == 2
    assert reduced["releases_refused"] == 3
    assert tracker.collect(worker) is None  # nothing new since


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
    stats = tracker.collect(worker)
    assert stats is not None
    reduced = stats.reduce()
    assert reduced["late_announcements"] == 1
    assert reduced["quarantined_blocks"] == 4
    assert reduced["late_completions"] == 2
