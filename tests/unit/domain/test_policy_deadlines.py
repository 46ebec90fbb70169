"""Each deadline and lease check of :class:`TransferPolicy`, with exact figures.

Timeouts are binary fractions, so every sum is exact and compared with ``==``.
"""

from __future__ import annotations

import random

import pytest

from moriio.adapters.chaos import ChannelFaultPlan, EngineFaultPlan
from moriio.domain.timing.policy import MAX_LEASE_SECONDS, TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.stacks.memory import KVMemory
from moriio.testing.stacks.stack import Endpoint, Timing, build_stack

POLICY = TransferPolicy(
    transfer_timeout=5.0,
    defer_timeout=7.0,
    clock_skew_allowance=0.5,
    quarantine_timeout=3.0,
    liveness_timeout=2.0,
)


def test_each_deadline_adds_its_own_timeouts() -> None:
    assert POLICY.transfer_deadline(100.0) == 105.0
    assert POLICY.defer_deadline(100.0) == 107.0
    assert POLICY.lease_end(1000.0) == 1007.0
    assert POLICY.write_by(1000.0) == 1007.0
    assert POLICY.reclaim_after == 7.5
    assert POLICY.reclaim_deadline(100.0) == 107.5
    assert POLICY.read_hold_deadline(100.0) == 112.5
    assert POLICY.write_fence(100.0) == 115.5
    assert POLICY.quarantine_deadline(100.0) == 103.0


def test_the_defaults_give_the_documented_figures() -> None:
    policy = TransferPolicy()
    assert policy.reclaim_after == 61.0
    assert policy.read_hold_deadline(0.0) == 91.0
    assert policy.write_fence(0.0) == 121.0
    assert policy.liveness_silence(1.5) == 7.5
    assert policy.read_fits_lease()


@pytest.mark.parametrize(
    "policy",
    [POLICY, TransferPolicy(), TransferPolicy(clock_skew_allowance=0.0, defer_timeout=0.25)],
)
def test_the_worker_holds_read_blocks_past_the_schedulers_reclaim(policy: TransferPolicy) -> None:
    for now in (0.0, 12.5, 1e6):
        assert policy.lease_end(now) <= policy.reclaim_deadline(now)
        assert policy.reclaim_deadline(now) < policy.read_hold_deadline(now)


@pytest.mark.parametrize(
    ("expires", "too_short"),
    [(105.25, True), (105.5, False), (106.0, False)],  # 100 + 5 s transfer + 0.5 s skew
)
def test_a_read_lease_must_outlast_a_transfer_and_the_skew(expires: float, too_short: bool) -> None:
    assert POLICY.read_lease_too_short(expires, 100.0) is too_short


@pytest.mark.parametrize(
    ("write_by", "passed"),
    [(100.25, True), (100.5, True), (100.75, False)],  # 100 + 0.5 s skew
)
def test_a_write_by_lease_is_shortened_by_the_skew(write_by: float, passed: bool) -> None:
    assert POLICY.write_by_passed(write_by, 100.0) is passed


@pytest.mark.parametrize(
    ("expires", "absurd"),
    [(100.5 + MAX_LEASE_SECONDS, False), (100.75 + MAX_LEASE_SECONDS, True)],
)
def test_a_lease_beyond_any_configuration_is_absurd(expires: float, absurd: bool) -> None:
    assert POLICY.lease_absurd(expires, 100.0) is absurd


@pytest.mark.parametrize(
    ("transfer", "skew", "fits"),
    [(6.0, 0.5, True), (6.5, 0.5, False), (6.5, 0.25, True), (7.0, 0.0, False)],
)
def test_a_read_fits_the_lease_only_with_time_to_spare(
    transfer: float, skew: float, fits: bool
) -> None:
    policy = TransferPolicy(transfer_timeout=transfer, defer_timeout=7.0, clock_skew_allowance=skew)
    assert policy.read_fits_lease() is fits


def test_liveness_silence_counts_timeouts_and_none_without_probes() -> None:
    assert POLICY.liveness_silence(1.5) == 3.0
    assert POLICY.liveness_silence(1.0) == 2.0
    assert TransferPolicy(liveness_timeout=0).liveness_silence(1.5) == 0.0


def test_a_parked_transfer_waits_for_one_handshake_and_a_free_thread() -> None:
    clock = FakeClock()
    stack = build_stack(
        name="consumer#0",
        mode=TransferMode.READ,
        is_producer=False,
        endpoint=Endpoint(handshake_port=8000, notify_port=8100),
        memory=KVMemory(1, 4, 4),
        clock=clock,
        fabric=InMemoryFabric(),
        network=InMemoryNetwork(clock),
        timing=Timing(handshake_timeout=0.25),
        rng=random.Random(1),
        engine_plan=EngineFaultPlan(),
        channel_plan=ChannelFaultPlan(),
    )
    peers = stack.service.ctx.peers
    assert peers.handshake_timeout == 0.25
    assert peers.handshake_wait_deadline(10.0) == 10.5
