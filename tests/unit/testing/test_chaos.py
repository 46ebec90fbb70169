"""Chaos wrappers: seeded faults on any TransferEngine or ControlChannel, counted per kind."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from moriio.adapters.chaos import (
    ChannelFault,
    ChannelFaultPlan,
    ChaosControlChannel,
    ChaosTransferEngine,
    EngineFault,
    EngineFaultPlan,
)
from moriio.ports import (
    ControlChannel,
    Inbound,
    RequestTimeoutError,
    TransferEngine,
    TransferEngineError,
    TransferHandle,
    TransferOp,
    TransferState,
)
from moriio.testing.contract import Msg, PingCodec, ping
from moriio.testing.inmemory import (
    FakeClock,
    InMemoryControlChannel,
    InMemoryFabric,
    InMemoryNetwork,
    InMemoryTransferEngine,
)

SIZE = 256

# -- engine ------------------------------------------------------------------------------------


class Pair:
    """A chaos engine ``a`` (reading from / writing to ``b``) over two in-memory engines."""

    def __init__(
        self, plan: EngineFaultPlan, seed: int = 0, clock: FakeClock | None = None
    ) -> None:
        self.fabric = InMemoryFabric()
        self.inner = InMemoryTransferEngine("a", self.fabric)
        self.b = InMemoryTransferEngine("b", self.fabric)
        self.a = ChaosTransferEngine(self.inner, random.Random(seed), plan, clock)
        self.a_buf = np.zeros(SIZE, np.uint8)
        self.b_buf = (np.arange(SIZE) % 251 + 1).astype(np.uint8)
        self.a_region = self.a.register_region(self.a_buf.ctypes.data, SIZE)
        b_region = self.b.register_region(self.b_buf.ctypes.data, SIZE)
        self.peer = self.a.add_peer(self.b.metadata())
        self.remote = self.a.import_region(self.peer, b_region.descriptor)

    def read(self, size: int = SIZE, offset: int = 0) -> TransferHandle:
        zero = np.zeros(1, np.int64)
        return self.a.post(
            TransferOp.READ,
            self.a_region,
            self.remote,
            zero,
            np.array([offset], np.int64),
            np.array([size], np.int64),
            "t",
        )

    def poll_until_terminal(self, handle: TransferHandle, limit: int = 200) -> tuple[int, Any]:
        for n in range(1, limit + 1):
            status = self.a.poll(handle)
            if status.state is not TransferState.IN_PROGRESS:
                return n, status
        return limit, self.a.poll(handle)

    @property
    def moved(self) -> bool:
        return bool(np.array_equal(self.a_buf, self.b_buf))


def test_conforms_to_the_port() -> None:
    pair = Pair(EngineFaultPlan())
    engine: TransferEngine = pair.a
    assert engine.name == "a"
    assert engine.metadata() == pair.inner.metadata()


def test_a_quiet_plan_passes_transfers_through() -> None:
    pair = Pair(EngineFaultPlan())
    _, status = pair.poll_until_terminal(pair.read())
    assert status.state is TransferState.SUCCEEDED
    assert pair.moved
    assert pair.a.injected == {}
    assert EngineFaultPlan().is_quiet


def test_backpressure_comes_in_bursts_and_moves_no_bytes() -> None:
    pair = Pair(EngineFaultPlan(backpressure=1.0, burst_max=3))
    states = [pair.a.poll(pair.read()).state for _ in range(5)]
    assert states == [TransferState.BACKPRESSURE] * 5
    assert pair.a.injected == {EngineFault.BACKPRESSURE: 5}
    assert not pair.moved
    assert pair.inner.posted == []  # never reached the inner engine


def test_one_draw_starts_a_burst_of_consecutive_backpressure() -> None:
    pair = Pair(EngineFaultPlan(backpressure=0.1, burst_max=8), seed=4)
    states = [pair.a.poll(pair.read()).state for _ in range(200)]
    runs, current = [], 0
    for state in states:
        current = current + 1 if state is TransferState.BACKPRESSURE else 0
        runs.append(current)
    assert max(runs) >= 3  # bursts, not isolated refusals
    assert pair.a.injected[EngineFault.BACKPRESSURE] == states.count(TransferState.BACKPRESSURE)
    pair.a.plan = EngineFaultPlan()  # a new plan ends any burst
    assert pair.a.poll(pair.read()).state is not TransferState.BACKPRESSURE


def test_failed_posts_fail_terminally_before_any_byte_moves() -> None:
    pair = Pair(EngineFaultPlan(failed=1.0))
    handle = pair.read()
    status = pair.a.poll(handle)
    assert status.state is TransferState.FAILED
    assert "injected" in status.message
    assert not pair.moved
    assert pair.a.injected == {EngineFault.FAILED: 1}


def test_a_failure_in_flight_runs_the_transfer_then_reports_failed() -> None:
    pair = Pair(EngineFaultPlan(failed_in_flight=1.0))
    _, status = pair.poll_until_terminal(pair.read())
    assert status.state is TransferState.FAILED
    assert pair.moved  # the bytes landed, yet the transfer must count as failed
    assert pair.a.poll(pair.read()).state is not TransferState.SUCCEEDED


def test_a_hung_transfer_stays_in_progress_until_released() -> None:
    pair = Pair(EngineFaultPlan(hung=1.0))
    handle = pair.read()
    polls, status = pair.poll_until_terminal(handle, limit=100)
    assert polls == 100
    assert status.state is TransferState.IN_PROGRESS
    assert pair.a.num_batches == 1
    pair.a.release(handle)
    assert pair.a.num_batches == 0
    with pytest.raises(TransferEngineError, match="unknown or released"):
        pair.a.poll(handle)
    assert not pair.moved


def test_removing_the_peer_fails_a_hung_transfer() -> None:
    pair = Pair(EngineFaultPlan(hung=1.0))
    handle = pair.read()
    pair.a.remove_peer(pair.peer)
    status = pair.a.poll(handle)
    assert status.state is TransferState.FAILED
    assert "removed" in status.message


def test_a_slow_transfer_completes_after_extra_polls() -> None:
    pair = Pair(EngineFaultPlan(slow=1.0, slow_polls=5))
    polls, status = pair.poll_until_terminal(pair.read())
    assert status.state is TransferState.SUCCEEDED
    assert 2 <= polls <= 6
    assert pair.moved
    assert pair.a.injected == {EngineFault.SLOW: 1}


def test_a_retirement_fails_batches_in_flight_whose_bytes_still_land() -> None:
    """A NIC fault (mori 1.2.4 retires the endpoints): the batch in flight fails at once, is
    not settled until its bytes landed, and the next post is refused before it is posted."""
    clock = FakeClock()
    pair = Pair(EngineFaultPlan(slow=1.0, slow_polls=1, late_max=0.5), clock=clock)
    landed: list[object] = []
    pair.a.on_land = landed.append
    handle = pair.read()
    assert pair.a.poll(handle).state is TransferState.IN_PROGRESS  # held back one poll

    assert pair.a.retire(random.Random(1)) == 1

    failed = pair.a.poll(handle)
    assert failed.state is TransferState.FAILED
    assert "retired" in failed.message
    assert not pair.a.settled(handle), "its bytes may still land"
    assert not pair.moved
    refused = pair.a.poll(pair.read())
    assert refused.state is TransferState.BACKPRESSURE
    clock.advance(0.5)
    pair.a.land_due()
    assert pair.moved  # landed after it was reported failed
    assert landed
    assert pair.a.settled(handle)
    assert pair.a.retired_landings == 1
    assert pair.a.injected[EngineFault.RETIRED] == 1


@pytest.mark.parametrize(
    "plan",
    [
        EngineFaultPlan(),
        EngineFaultPlan(backpressure=1.0),
        EngineFaultPlan(failed=1.0),
        EngineFaultPlan(hung=1.0),
        EngineFaultPlan(slow=1.0),
    ],
)
def test_out_of_range_descriptors_raise_whatever_the_fault(plan: EngineFaultPlan) -> None:
    pair = Pair(plan)
    with pytest.raises(TransferEngineError):
        pair.read(size=SIZE, offset=8)


def test_the_same_seed_injects_the_same_faults() -> None:
    plan = EngineFaultPlan(backpressure=0.2, failed=0.2, failed_in_flight=0.2, hung=0.1, slow=0.2)

    def run(seed: int) -> tuple[list[TransferState], Mapping[str, int]]:
        pair = Pair(plan, seed=seed)
        states = [pair.poll_until_terminal(pair.read(), limit=20)[1].state for _ in range(60)]
        return states, pair.a.injected

    assert run(5) == run(5)
    states, injected = run(5)
    per_post = set(EngineFault) - {
        EngineFault.LATE,  # needs a clock
        EngineFault.LOST_CANCEL,  # per cancel, not per post
        EngineFault.STUCK_AFTER_REMOVE,  # per removed peer
        EngineFault.RETIRED,  # when the caller (the simulation) says
    }
    assert set(injected) == per_post  # every kind in the plan showed up in 60 posts
    assert run(6)[0] != states


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"failed": 1.5}, "probability"),
        ({"hung": -0.1}, "probability"),
        ({"failed": 0.6, "hung": 0.6}, "must not exceed 1"),
        ({"burst_max": 0}, "burst_max"),
        ({"slow_polls": 0}, "slow_polls"),
    ],
)
def test_engine_plans_are_validated(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EngineFaultPlan(**kwargs)


def test_the_moderate_plans_inject_every_kind_rarely() -> None:
    engine, channel = EngineFaultPlan.moderate(), ChannelFaultPlan.moderate()
    assert not engine.is_quiet
    assert not channel.is_quiet
    assert 0 < engine.hung < engine.slow < 0.1
    assert 0 < channel.drop < 0.05


# -- channel -----------------------------------------------------------------------------------


class Wire:
    """Sender ``a`` (plain) and receiver ``b`` (chaos-wrapped) on one network and clock."""

    def __init__(self, plan: ChannelFaultPlan, seed: int = 0) -> None:
        self.clock = FakeClock()
        network = InMemoryNetwork(self.clock)
        self.a: InMemoryControlChannel[Msg] = InMemoryControlChannel(network, PingCodec())
        self.inner: InMemoryControlChannel[Msg] = InMemoryControlChannel(network, PingCodec())
        self.b = ChaosControlChannel(self.inner, random.Random(seed), plan, self.clock)

    def send(self, *seqs: int) -> None:
        for seq in seqs:
            self.a.send(self.b.address, ping(seq))

    def received(self) -> list[int]:
        return [i.message["seq"] for i in self.b.drain()]


def seqs_of(inbound: list[Inbound[Msg]]) -> list[int]:
    return [i.message["seq"] for i in inbound]


def test_channel_conforms_and_passes_through_when_quiet() -> None:
    wire = Wire(ChannelFaultPlan())
    channel: ControlChannel[Msg] = wire.b
    assert channel.address == wire.inner.address
    wire.send(1, 2, 3)
    assert wire.received() == [1, 2, 3]
    assert wire.b.injected == {}
    assert wire.b.listener_alive


def test_dropped_messages_never_arrive() -> None:
    wire = Wire(ChannelFaultPlan(drop=1.0))
    wire.send(1, 2)
    assert wire.received() == []
    assert wire.b.injected == {ChannelFault.DROPPED: 2}


def test_duplicated_messages_arrive_twice() -> None:
    wire = Wire(ChannelFaultPlan(duplicate=1.0))
    wire.send(7)
    assert wire.received() == [7, 7]
    assert wire.b.injected == {ChannelFault.DUPLICATED: 1}


def test_a_reordered_message_is_overtaken_by_later_ones() -> None:
    wire = Wire(ChannelFaultPlan(reorder=1.0))
    wire.send(1)
    assert wire.received() == []
    wire.b.plan = ChannelFaultPlan()
    wire.send(2)
    got = wire.received()
    for _ in range(4):
        got += wire.received()
    assert got == [2, 1]
    assert wire.b.injected == {ChannelFault.REORDERED: 1}


def test_a_delayed_message_waits_for_the_clock() -> None:
    wire = Wire(ChannelFaultPlan(delay=1.0, delay_max=0.5))
    wire.send(1)
    assert wire.received() == []
    assert wire.b.num_held == 1
    wire.clock.advance(0.5)
    assert wire.received() == [1]
    assert wire.b.injected == {ChannelFault.DELAYED: 1}


def test_held_messages_are_bounded() -> None:
    wire = Wire(ChannelFaultPlan(delay=1.0, delay_max=10.0, max_held=3))
    wire.send(1, 2, 3, 4, 5)
    assert wire.received() == []
    assert wire.b.num_held == 3
    assert wire.b.overflow == 2
    wire.clock.advance(10.0)
    assert sorted(wire.received()) == [3, 4, 5]


def responder_wire(plan: ChannelFaultPlan) -> tuple[Wire, ChaosControlChannel[Msg]]:
    wire = Wire(ChannelFaultPlan())
    wire.a.serve(lambda m: ping(m["seq"] + 1))
    requester = ChaosControlChannel(wire.inner, random.Random(1), plan, wire.clock)
    return wire, requester


def test_a_dropped_request_waits_its_timeout_and_raises() -> None:
    wire, requester = responder_wire(ChannelFaultPlan(request_drop=1.0))
    with pytest.raises(RequestTimeoutError, match="injected"):
        requester.request(wire.a.address, ping(1), timeout=2.0)
    assert wire.clock.now() == pytest.approx(2.0)
    assert requester.injected == {ChannelFault.REQUEST_DROPPED: 1}


def test_a_delayed_request_is_answered_late_or_times_out() -> None:
    wire, requester = responder_wire(ChannelFaultPlan(request_delay=1.0, delay_max=0.5))
    assert requester.request(wire.a.address, ping(1), timeout=1.0) == ping(2)
    assert 0.0 <= wire.clock.now() <= 0.5
    wire, requester = responder_wire(ChannelFaultPlan(request_delay=1.0, delay_max=1000.0))
    with pytest.raises(RequestTimeoutError):  # a delay past the timeout (seeded: 99.9%)
        requester.request(wire.a.address, ping(1), timeout=1.0)
    assert wire.clock.now() == pytest.approx(1.0)


def test_drop_next_loses_exactly_that_many_outgoing_messages_and_requests() -> None:
    wire, sender = responder_wire(ChannelFaultPlan())
    sender.drop_next(2)
    sender.send(wire.a.address, ping(1))
    with pytest.raises(RequestTimeoutError):
        sender.request(wire.a.address, ping(2), timeout=3.0)
    sender.send(wire.a.address, ping(3))
    assert seqs_of(wire.a.drain()) == [3]
    assert sender.injected == {ChannelFault.DROPPED: 1, ChannelFault.REQUEST_DROPPED: 1}
    assert wire.clock.now() == 3.0


class Marked(dict[str, Any]):
    """A message of its own kind (for drops that target one kind)."""


def test_drop_next_of_a_kind_spares_other_traffic() -> None:
    wire, sender = responder_wire(ChannelFaultPlan())
    sender.drop_next(1, Marked)
    sender.send(wire.a.address, ping(1))
    sender.send(wire.a.address, Marked(ping(2)))
    sender.send(wire.a.address, Marked(ping(3)))
    assert seqs_of(wire.a.drain()) == [1, 3]
    assert sender.injected == {ChannelFault.DROPPED: 1}


def test_the_same_seed_replays_the_same_channel_faults() -> None:
    plan = ChannelFaultPlan(drop=0.2, duplicate=0.2, reorder=0.2, delay=0.2, delay_max=0.01)

    def run(seed: int) -> list[int]:
        wire = Wire(plan, seed)
        got: list[int] = []
        for seq in range(50):
            wire.send(seq)
            got += wire.received()
            wire.clock.advance(0.001)
        wire.clock.advance(1.0)
        for _ in range(5):
            got += wire.received()
        return got

    assert run(9) == run(9)
    assert run(9) != run(10)


def test_close_closes_the_inner_channel() -> None:
    wire = Wire(ChannelFaultPlan(delay=1.0))
    wire.send(1)
    wire.b.drain()
    wire.b.close()
    assert not wire.b.listener_alive
    assert wire.b.num_held == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"drop": 2.0}, "probability"),
        ({"drop": 0.5, "delay": 0.6}, "must not exceed 1"),
        ({"request_drop": 0.7, "request_delay": 0.7}, "must not exceed 1"),
        ({"delay_max": -1.0}, "delay_max"),
        ({"max_held": 0}, "max_held"),
    ],
)
def test_channel_plans_are_validated(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ChannelFaultPlan(**kwargs)


# -- chaos mode in the container -----------------------------------------------------------


def test_chaos_seed_wraps_the_worker_engine_and_notify_channel() -> None:
    from moriio.bootstrap import WorkerIdentity
    from moriio.config.settings import ConnectorSettings
    from moriio.container import build_worker
    from moriio.domain.protocol.fingerprint import Fingerprint
    from moriio.domain.values.modes import TransferMode
    from moriio.testing.inmemory.wiring import InMemoryAdapters
    from moriio.testing.stacks.memory import KVMemory

    memory = KVMemory(num_layers=2, num_blocks=4, block_size=4)
    fingerprint = Fingerprint(
        model_name="m",
        dtype="int32",
        block_size=4,
        layout_kinds=("separated", "separated"),
        tp_size=1,
        transfer_mode=TransferMode.READ,
        total_num_kv_heads=1,
        is_mla=False,
    )
    identity = WorkerIdentity(
        engine_name="e0",
        host="127.0.0.1",
        bind_host="127.0.0.1",
        handshake_port=9000,
        notify_port=9100,
        tp_rank=0,
        tp_size=1,
        dp_rank=0,
        is_producer=True,
        is_consumer=False,
        fingerprint=fingerprint,
        instance_id="e0-1",
    )

    def build(seed: int | None) -> Any:
        clock = FakeClock()
        settings = ConnectorSettings(mode=TransferMode.READ, chaos_seed=seed)
        adapters = InMemoryAdapters(
            settings=settings,
            identity=identity,
            secret=None,
            fabric=InMemoryFabric(),
            network=InMemoryNetwork(clock),
            clock=clock,
        )
        return build_worker(settings, identity, memory.tensors(), adapters=adapters)

    plain = build(None)
    ctx = plain.service.ctx
    assert isinstance(ctx.channel, InMemoryControlChannel)
    plain.shutdown()
    chaotic = build(7)
    ctx = chaotic.service.ctx
    assert isinstance(ctx.channel, ChaosControlChannel)
    assert ctx.channel.plan == ChannelFaultPlan.moderate()
    assert isinstance(ctx.poster._engine, ChaosTransferEngine)
    assert ctx.poster._engine.plan == EngineFaultPlan.moderate()
    chaotic.shutdown()


def test_importing_the_container_loads_no_test_kit() -> None:
    import subprocess
    import sys

    probe = (
        "import sys, moriio.container;"
        "print(sorted(m for m in sys.modules if m.startswith('moriio.testing')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"
