"""FakeClock and SystemClock behave as the Clock port says."""

from __future__ import annotations

import math

import pytest

from moriio.adapters.clock import SystemClock
from moriio.ports import Clock
from moriio.testing.inmemory.clock import FakeClock


def test_fake_clock_starts_where_told_and_only_moves_by_hand() -> None:
    clock: Clock = FakeClock(start=12.5)
    assert clock.now() == 12.5
    assert clock.now() == 12.5


def test_advance_and_sleep_move_time_forward() -> None:
    clock = FakeClock()
    clock.advance(1.5)
    clock.sleep(0.25)
    clock.sleep(0)
    assert clock.now() == 1.75
    assert clock.sleeps == [0.25, 0.0]


@pytest.mark.parametrize("bad", [-0.001, math.nan, math.inf])
def test_fake_clock_refuses_to_go_back_or_to_infinity(bad: float) -> None:
    clock = FakeClock(start=3.0)
    with pytest.raises(ValueError, match="forward"):
        clock.advance(bad)
    with pytest.raises(ValueError, match="forward"):
        clock.sleep(bad)
    assert clock.now() == 3.0
    assert clock.sleeps == []


def test_fake_clock_start_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        FakeClock(start=math.inf)


def test_system_clock_is_monotonic_and_sleeps() -> None:
    clock: Clock = SystemClock()
    first = clock.now()
    clock.sleep(0.01)
    assert clock.now() >= first + 0.01


def test_system_clock_refuses_negative_sleep() -> None:
    with pytest.raises(ValueError, match="negative"):
        SystemClock().sleep(-1.0)
