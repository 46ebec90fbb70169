"""Transfers between engines of different TP sizes, through the real worker services.

Each engine is a group of TP ranks on the in-memory adapters (:mod:`support.tp_stacks`),
their KV heads split as vLLM splits them. A consumer rank must end with exactly its heads
of every block, gathered from the producer ranks that hold them (READ and WRITE, producer
TP larger or smaller, HND and NHD pages); every producer rank frees its blocks exactly once,
and a consumer reports its load exactly once. A pairing that cannot line up fails its loads
by name and frees the producers' blocks at once: nobody waits for a timeout.
"""

from __future__ import annotations

import pytest

from moriio.domain.params.orders import (
    ExpectWriteOrder,
    HoldOrder,
    ReadOrder,
    SaveOrder,
    StepOrders,
)
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.service import StepReport
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.stack import Timing
from support.tp_stacks import Group, engine_group

TIMING = Timing()
UID = 5
P_BLOCKS, D_BLOCKS = (3, 4, 7), (9, 1, 2)  # the prefill's blocks and the decode's


def _groups(
    mode: TransferMode, producer_tp: int, consumer_tp: int, heads: int, **kw: object
) -> tuple[FakeClock, Group, Group]:
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    common = {"mode": mode, "total_heads": heads, "clock": clock, "fabric": fabric, "net": net}
    producers = engine_group("prefill", producer=True, tp=producer_tp, base_port=7000, **common)
    consumer_kw = {**common, **kw}
    consumers = engine_group(
        "decode", producer=False, tp=consumer_tp, base_port=8000, **consumer_kw
    )  # type: ignore[arg-type]
    return clock, producers, consumers


class Reports:
    """What every rank reported, step after step: a request reported twice is a failure."""

    def __init__(self, groups: tuple[Group, ...]) -> None:
        self.services = [s for g in groups for s in g.services]
        self.sent: list[list[str]] = [[] for _ in self.services]
        self.received: list[list[str]] = [[] for _ in self.services]
        self.failed: list[set[str]] = [set() for _ in self.services]
        self.invalid: list[set[int]] = [set() for _ in self.services]

    def step(self) -> None:
        for i, service in enumerate(self.services):
            report: StepReport = service.finish_step()
            self.sent[i] += sorted(report.finished_sending)
            self.received[i] += sorted(report.finished_recving)
            self.failed[i] |= report.failed_recving
            self.invalid[i] |= report.invalid_block_ids


def _run(clock: FakeClock, reports: Reports, done: object, limit: float) -> None:
    """Step every rank until ``done()`` or the fake clock passes ``limit``."""
    while not done():  # type: ignore[operator]
        assert clock.now() < limit, "the transfer did not end in time"
        reports.step()
        clock.advance(TIMING.tick)


def _read(producers: Group, consumers: Group) -> None:
    read = ReadOrder("d-1", "tx-1", D_BLOCKS, P_BLOCKS, producers.endpoint(), None, load_async=True)
    read = signed_read(read, instance_id="prefill")  # its token is the hand-off's first tag
    for service in producers.services:
        service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1", read.token)]), 0.0)
    for service in consumers.services:
        service.start_step(StepOrders(reads=[read]), 0.0)


def _write(producers: Group, consumers: Group) -> None:
    save = SaveOrder("p-1", "tx-1", (P_BLOCKS,), consumers.endpoint(), prompt=PROMPT)
    for service, memory in zip(producers.services, producers.memories, strict=True):
        service.start_step(StepOrders(saves=[save]), 0.0)
        for tensor in memory.tensors():
            service.save_layer(tensor.name)
        service.end_forward()
    expect = ExpectWriteOrder("d-1", "tx-1", D_BLOCKS, 0, producers.endpoint(), prompt=PROMPT)
    for service in consumers.services:
        service.start_step(StepOrders(expect_writes=[expect]), 0.0)
    for service in producers.services:
        service.finish_step()
        service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1")]), 0.0)


@pytest.mark.parametrize("hnd", [True, False], ids=["HND", "NHD"])
@pytest.mark.parametrize("mode", [TransferMode.READ, TransferMode.WRITE], ids=["read", "write"])
@pytest.mark.parametrize(
    ("producer_tp", "consumer_tp", "heads"),
    [(2, 1, 2), (1, 2, 2), (4, 2, 4), (2, 4, 4), (2, 1, 1), (1, 2, 1), (4, 1, 2)],
    ids=["2->1", "1->2", "4->2", "2->4", "2->1 one head", "1->2 one head", "4->1 replicated"],
)
def test_every_consumer_rank_gets_its_heads_and_every_rank_ends_once(
    mode: TransferMode, producer_tp: int, consumer_tp: int, heads: int, hnd: bool
) -> None:
    clock, producers, consumers = _groups(mode, producer_tp, consumer_tp, heads, hnd=hnd)
    for memory in producers.memories:
        memory.write(UID, P_BLOCKS, 0)
    (_read if mode is TransferMode.READ else _write)(producers, consumers)
    reports = Reports((producers, consumers))
    n_p = producer_tp

    def done() -> bool:
        return all(reports.sent[:n_p]) and all(reports.received[n_p:])

    _run(clock, reports, done, 20 * TIMING.transfer_timeout)
    for _ in range(5):  # nothing is reported twice, even later
        reports.step()
        clock.advance(TIMING.tick)
    assert reports.sent[:n_p] == [["p-1"]] * n_p
    assert reports.received[n_p:] == [["d-1"]] * consumer_tp
    assert not any(reports.failed)
    assert not any(reports.invalid)
    for memory in consumers.memories:
        assert memory.holds(UID, D_BLOCKS, 0)
        assert memory.untouched([b for b in range(12) if b not in D_BLOCKS])
    moved = sum(s.take_stats().bytes_moved for s in (*producers.services, *consumers.services))
    total_bytes = heads * 2 * 3 * 4 * 4 * 4  # heads x layers x blocks x tokens x cell (int32)
    per_consumer = max(heads // consumer_tp, 1) * 2 * 3 * 4 * 4 * 4
    assert moved == per_consumer * consumer_tp  # each unit each consumer holds moves once
    assert total_bytes >= per_consumer


def _run_refused(clock: FakeClock, reports: Reports, mode: TransferMode, n_p: int) -> None:
    """Step a refused pairing until its loads failed and the prefill ranks let their blocks
    go. WRITE: at once (nothing was announced, the decode frees every rank). READ: a decode
    frees only hand-offs it verified against a handshaken prefill's key, and none is
    handshaken here: each prefill rank's hold ends at its worker deadline (the scheduler
    reclaims at its lease), and no release ever came."""
    if mode is TransferMode.WRITE:
        done = lambda: all(reports.sent[:n_p]) and all(reports.received[n_p:])  # noqa: E731
        _run(clock, reports, done, TIMING.defer_timeout / 2)
        assert reports.sent[:n_p] == [["p-1"]] * n_p
        return
    _run(clock, reports, lambda: all(reports.received[n_p:]), TIMING.defer_timeout / 2)
    _run(clock, reports, lambda: clock.now() >= 2 * _hold_end(), 3 * _hold_end())
    assert reports.sent[:n_p] == [[]] * n_p
    assert all(service.num_live == 0 for service in reports.services[:n_p])


def _hold_end() -> float:
    return TIMING.policy.read_hold_deadline(0.0)


@pytest.mark.parametrize("mode", [TransferMode.READ, TransferMode.WRITE], ids=["read", "write"])
def test_tp_sizes_that_do_not_pair_fail_the_load_and_free_every_producer_rank(
    mode: TransferMode,
) -> None:
    clock, producers, consumers = _groups(mode, 2, 3, 6)
    for memory in producers.memories:
        memory.write(UID, P_BLOCKS, 0)
    (_read if mode is TransferMode.READ else _write)(producers, consumers)
    reports = Reports((producers, consumers))
    _run_refused(clock, reports, mode, 2)
    assert reports.failed[2:] == [{"d-1"}] * 3
    for memory in consumers.memories:
        assert memory.untouched(range(12))
    stats = consumers.services[0].take_stats()
    assert dict(stats.failures_by_kind) == {"tp_mismatch": 1}


@pytest.mark.parametrize("mode", [TransferMode.READ, TransferMode.WRITE], ids=["read", "write"])
def test_shards_that_do_not_line_up_are_refused_by_layer_and_free_every_rank(
    mode: TransferMode, caplog: pytest.LogCaptureFixture
) -> None:
    """The decode's heads are wider than the prefill's: refused at the handshake, naming
    the layer and the field; WRITE: the prefill's blocks are freed without waiting for a
    lease."""
    clock, producers, consumers = _groups(mode, 2, 1, 2, head=4)
    for memory in producers.memories:
        memory.write(UID, P_BLOCKS, 0)
    (_read if mode is TransferMode.READ else _write)(producers, consumers)
    reports = Reports((producers, consumers))
    _run_refused(clock, reports, mode, 2)
    assert reports.failed[2:] == [{"d-1"}]
    assert consumers.memories[0].untouched(range(12))
    assert (
        "layer 'model.layers.0.self_attn.attn', group 0: KV heads, plane 0: row_bytes differs"
        in caplog.text
    )
