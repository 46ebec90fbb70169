import math

import pytest

from moriio.domain.timing.policy import TransferPolicy


def test_defaults_match_the_documented_values() -> None:
    policy = TransferPolicy()
    assert policy.transfer_timeout == 30.0
    assert policy.defer_timeout == 60.0
    assert policy.backoff_initial == 0.001
    assert policy.backoff_max == 0.050


def test_deadlines_add_the_timeouts() -> None:
    policy = TransferPolicy(transfer_timeout=5.0, defer_timeout=7.0)
    assert policy.transfer_deadline(100.0) == 105.0
    assert policy.defer_deadline(100.0) == 107.0


@pytest.mark.parametrize(
    "field", ["transfer_timeout", "defer_timeout", "backoff_initial", "backoff_max"]
)
@pytest.mark.parametrize("value", [0.0, -1.0, math.inf, math.nan])
def test_invalid_values_name_the_field(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        TransferPolicy(**{field: value})


def test_non_numeric_value_is_a_type_error_naming_the_field() -> None:
    with pytest.raises(TypeError, match="defer_timeout"):
        TransferPolicy(defer_timeout="60")  # type: ignore[arg-type]


def test_initial_backoff_above_maximum_is_rejected() -> None:
    with pytest.raises(ValueError, match="backoff_initial"):
        TransferPolicy(backoff_initial=0.1, backoff_max=0.05)


def test_factor_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="backoff_factor"):
        TransferPolicy(backoff_factor=0.5)


def test_backoff_doubles_from_one_millisecond_up_to_fifty() -> None:
    policy = TransferPolicy()
    delays = [policy.backoff_delay(n) for n in range(9)]
    assert delays == pytest.approx([0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.05, 0.05, 0.05])
    assert policy.backoff_delay(10_000) == 0.05  # no overflow for huge retry counts


def test_backoff_with_factor_one_stays_constant() -> None:
    policy = TransferPolicy(backoff_factor=1.0)
    assert policy.backoff_delay(0) == policy.backoff_delay(50) == 0.001


def test_retry_schedule_advances_and_is_bounded_by_the_transfer_deadline() -> None:
    policy = TransferPolicy(transfer_timeout=0.1)
    backoff = policy.backoff(posted_at=10.0)
    assert backoff.deadline == pytest.approx(10.1)
    assert backoff.next_attempt_at(10.0) == pytest.approx(10.001)
    backoff = backoff.retried().retried()
    assert backoff.retries == 2
    assert backoff.next_attempt_at(10.02) == pytest.approx(10.024)
    assert backoff.may_retry(10.02)
    # A retry due at or after the deadline is not allowed.
    assert backoff.next_attempt_at(10.096) is None
    assert not backoff.may_retry(10.2)


def test_retries_until_the_deadline_are_finite() -> None:
    policy = TransferPolicy(transfer_timeout=1.0)
    backoff, now, attempts = policy.backoff(0.0), 0.0, 0
    while (due := backoff.next_attempt_at(now)) is not None:
        now, backoff, attempts = due, backoff.retried(), attempts + 1
    assert now < 1.0
    assert 20 < attempts < 40  # 6 growing delays, then 50 ms steps


def test_the_clock_skew_allowance_defaults_to_one_second() -> None:
    assert TransferPolicy().clock_skew_allowance == 1.0
    assert TransferPolicy(clock_skew_allowance=0.0).clock_skew_allowance == 0.0


@pytest.mark.parametrize("value", [-0.1, math.inf, math.nan, 1e9])
def test_an_absurd_clock_skew_allowance_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="clock_skew_allowance"):
        TransferPolicy(clock_skew_allowance=value)
