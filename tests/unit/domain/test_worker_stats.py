"""Worker stats as a frozen snapshot, and the poster's result observers."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pytest

from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import PeerEndpoint
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.poster import PostResult
from moriio.domain.worker.stats import WorkerStats
from moriio.testing.handoffs import signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.stack import HOST, Stack
from support.worker_stacks import PRODUCER, worker_stack


def _read_once() -> tuple[Stack, list[PostResult], tuple[str, ...]]:
    """One READ of blocks (3, 4) into (1, 2); the consumer's poster results, as observed."""
    consumer, observed, names, _ = _read_once_with_producer()
    return consumer, observed, names


def _read_once_with_producer() -> tuple[Stack, list[PostResult], tuple[str, ...], Stack]:
    """:func:`_read_once`, and the producer that held the blocks."""
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    producer, p_memory = worker_stack("producer#0", True, TransferMode.READ, clock, fabric, net)
    consumer, d_memory = worker_stack("consumer#0", False, TransferMode.READ, clock, fabric, net)
    observed: list[PostResult] = []

    def observe(results: Sequence[PostResult]) -> None:
        observed.extend(results)

    consumer.service.observe_batches(observe)
    p_memory.write(9, (3, 4), 0)
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    consumer.service.start_step(
        StepOrders(reads=[signed_read(ReadOrder("d-1", "tx-1", (1, 2), (3, 4), peer, None))]), 0.0
    )
    for layer in d_memory.layer_names:
        consumer.service.wait_for_layer(layer)
    consumer.service.finish_step()
    assert d_memory.holds(9, (1, 2), 0)
    return consumer, observed, d_memory.layer_names, producer


def test_a_read_prefill_counts_its_hand_off_as_a_transfer_that_succeeded() -> None:
    _, _, _, producer = _read_once_with_producer()
    service = producer.service
    for _ in range(20):  # until the consumer's release has arrived
        service.start_step(StepOrders(), 0.0)
        service.finish_step()
        if service.stats_snapshot().transfers_succeeded:
            break
    stats = service.take_stats()
    assert (stats.transfers_started, stats.transfers_succeeded) == (1, 1)
    assert (stats.transfers_failed, stats.transfers_expired) == (0, 0)


def test_take_stats_reports_each_duration_sample_once() -> None:
    consumer, _, names = _read_once()
    service = consumer.service
    layers = len(names)

    peeked = service.stats_snapshot()
    assert peeked.transfer_seconds == ()
    assert peeked.load_seconds == ()

    taken = service.take_stats()
    assert taken.transfers_started == taken.transfers_succeeded == 1
    assert taken.batches_succeeded == taken.posts == layers
    assert taken.bytes_moved > 0
    assert taken.handshakes == 1
    assert len(taken.transfer_seconds) == layers
    assert len(taken.load_seconds) == 1

    counts = taken.counts()
    assert counts["posts"] == layers
    assert counts["handshakes_rejected"] == 0
    assert "failures_by_kind" not in counts
    assert "transfer_seconds" not in counts

    again = service.take_stats()
    assert again.transfer_seconds == again.load_seconds == ()
    assert again.bytes_moved == taken.bytes_moved  # counters stay cumulative


def test_the_snapshot_is_a_frozen_value() -> None:
    stats = _read_once()[0].service.take_stats()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.posts = 0  # type: ignore[misc]
    assert isinstance(hash(stats), int)
    assert stats == dataclasses.replace(stats)
    assert WorkerStats().failures_by_kind == ()


def test_poster_observers_see_every_result_the_service_gets() -> None:
    consumer, observed, names = _read_once()
    assert sorted(r.request.layer for r in observed) == sorted(names)
    assert all(r.ok and r.request.transfer_id == "tx-1" for r in observed)
    moved = sum(r.request.plan.total_bytes for r in observed)
    assert moved == consumer.service.stats_snapshot().bytes_moved
