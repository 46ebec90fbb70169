import pytest

from moriio.domain.ledgers import AckResult, Outcome, ReleaseLedger, TrackResult


def test_single_ack_releases_and_report_unmaps_once() -> None:
    ledger = ReleaseLedger()
    assert ledger.track("t1", "req-1", deadline=10.0, now=0.0) is TrackResult.TRACKED
    assert ledger.ack("t1", now=1.0) is AckResult.RELEASED
    # The mapping stays until the release is reported.
    assert ledger.request_id("t1") == "req-1"
    assert ledger.transfer_id("req-1") == "t1"
    (released,) = ledger.pop_released()
    assert released.request_id == "req-1"
    assert released.outcome is Outcome.SUCCEEDED
    assert ledger.request_id("t1") is None
    assert ledger.transfer_id("req-1") is None
    assert ledger.pop_released() == []


def test_structured_release_ack_waits_for_all_expected_acks() -> None:
    ledger = ReleaseLedger(producer_tp=4)
    ledger.track("t1", "req-fanin", deadline=10.0, now=0.0)
    assert ledger.ack("t1", now=1.0, consumer_tp_size=8) is AckResult.COUNTED
    assert ledger.ack_count("t1") == 1
    assert ledger.pop_released() == []
    assert ledger.ack("t1", now=1.0, consumer_tp_size=8) is AckResult.RELEASED
    assert [r.request_id for r in ledger.pop_released()] == ["req-fanin"]


def test_duplicate_ack_after_completion_does_not_resolve_twice() -> None:
    ledger = ReleaseLedger(producer_tp=4)
    ledger.track("t1", "r", deadline=10.0, now=0.0)
    ledger.ack("t1", now=1.0, consumer_tp_size=8)
    ledger.ack("t1", now=1.0, consumer_tp_size=8)
    assert ledger.ack("t1", now=1.0, consumer_tp_size=8) is AckResult.DUPLICATE
    assert len(ledger.pop_released()) == 1
    assert ledger.ack("t1", now=2.0, consumer_tp_size=8) is AckResult.DUPLICATE
    assert ledger.pop_released() == []
    assert ledger.stats.duplicates_ignored == 2


def test_abort_release_with_consumer_tp_one_resolves_a_fan_in_transfer() -> None:
    ledger = ReleaseLedger(producer_tp=4)
    ledger.track("t1", "r", deadline=10.0, now=0.0)
    assert ledger.ack("t1", now=1.0, consumer_tp_size=1) is AckResult.RELEASED


def test_a_consumer_tp_that_does_not_pair_releases_with_its_one_ack() -> None:
    """Sizes that do not pair fail their loads, and each producer rank is told once."""
    ledger = ReleaseLedger(producer_tp=4)
    assert ledger.ack("t1", now=0.0, consumer_rank=1, consumer_tp_size=6) is AckResult.BUFFERED
    assert ledger.track("t1", "r", deadline=10.0, now=0.0) is TrackResult.RELEASED
    assert [r.request_id for r in ledger.pop_released()] == ["r"]


def test_a_consumer_tp_size_out_of_range_is_rejected_before_buffering() -> None:
    ledger = ReleaseLedger(producer_tp=4)
    with pytest.raises(ValueError, match="consumer_tp"):
        ledger.ack("t1", now=0.0, consumer_tp_size=0)
    assert ledger.stats.buffered_events == 0


def test_acks_before_the_mapping_are_buffered_and_applied_on_track() -> None:
    ledger = ReleaseLedger(producer_tp=1)
    assert ledger.ack("t1", now=0.0) is AckResult.BUFFERED
    assert ledger.stats.buffered_events == 1
    assert ledger.track("t1", "req-1", deadline=10.0, now=1.0) is TrackResult.RELEASED
    assert ledger.stats.buffered_events == 0
    assert [r.request_id for r in ledger.pop_released()] == ["req-1"]


def test_buffered_partial_fan_in_counts_toward_the_release() -> None:
    ledger = ReleaseLedger(producer_tp=2)
    ledger.ack("t1", now=0.0, consumer_tp_size=8)
    assert ledger.track("t1", "r", deadline=10.0, now=0.0) is TrackResult.TRACKED
    assert ledger.ack_count("t1") == 1
    for _ in range(3):
        ledger.ack("t1", now=0.0, consumer_tp_size=8)
    assert len(ledger.pop_released()) == 1


def test_buffered_failure_releases_as_failed() -> None:
    ledger = ReleaseLedger()
    assert ledger.fail("t1", "write failed", now=0.0) is AckResult.BUFFERED
    assert ledger.track("t1", "r", deadline=10.0, now=0.0) is TrackResult.RELEASED
    (released,) = ledger.pop_released()
    assert released.outcome is Outcome.FAILED
    assert released.message == "write failed"


def test_buffer_is_bounded_in_count_with_evictions_counted() -> None:
    ledger = ReleaseLedger(max_buffered_acks=3)
    for i in range(5):
        ledger.ack(f"t{i}", now=0.0)
    stats = ledger.stats
    assert stats.buffered_events == 3
    assert stats.buffered_evicted_overflow == 2
    # The oldest were evicted: their mapping no longer releases at once.
    assert ledger.track("t0", "r0", deadline=10.0, now=0.0) is TrackResult.TRACKED
    assert ledger.track("t4", "r4", deadline=10.0, now=0.0) is TrackResult.RELEASED


def test_buffer_is_bounded_in_age_with_evictions_counted() -> None:
    ledger = ReleaseLedger(buffered_ack_ttl=5.0)
    ledger.ack("old", now=0.0)
    ledger.ack("new", now=3.0)
    assert ledger.expire(now=5.0) == []
    stats = ledger.stats
    assert stats.buffered_evicted_stale == 1
    assert stats.buffered_events == 1
    assert ledger.track("old", "r", deadline=10.0, now=5.0) is TrackResult.TRACKED
    assert ledger.track("new", "r2", deadline=10.0, now=5.0) is TrackResult.RELEASED


def test_expired_transfers_are_reported_once_as_failures() -> None:
    ledger = ReleaseLedger(producer_tp=1)
    ledger.track("t1", "r1", deadline=5.0, now=0.0)
    ledger.track("t2", "r2", deadline=9.0, now=0.0)
    assert ledger.expire(4.0) == []
    (expired,) = ledger.expire(5.0)
    assert expired.transfer_id == "t1"
    assert expired.outcome is Outcome.EXPIRED
    assert ledger.ack("t1", now=6.0) is AckResult.DUPLICATE  # late ACK after expiry
    assert [(r.request_id, r.outcome) for r in ledger.pop_released()] == [("r1", Outcome.EXPIRED)]
    assert ledger.is_live("t2")
    assert ledger.stats.expired == 1


def test_set_deadline_extends_a_live_transfer() -> None:
    ledger = ReleaseLedger()
    ledger.track("t1", "r1", deadline=5.0, now=0.0)
    assert ledger.set_deadline("t1", 60.0)
    assert ledger.expire(10.0) == []
    assert ledger.deadline("t1") == 60.0
    assert not ledger.set_deadline("nope", 60.0)


def test_track_after_release_never_releases_twice() -> None:
    ledger = ReleaseLedger()
    ledger.track("t1", "r1", deadline=5.0, now=0.0)
    ledger.ack("t1", now=1.0)
    ledger.pop_released()
    assert ledger.track("t1", "r1", deadline=5.0, now=2.0) is TrackResult.TERMINAL
    assert ledger.expire(100.0) == []
    assert ledger.pop_released() == []


def test_conflicting_mappings_are_rejected() -> None:
    ledger = ReleaseLedger()
    ledger.track("t1", "r1", deadline=5.0, now=0.0)
    assert ledger.track("t1", "r1", deadline=5.0, now=0.0) is TrackResult.TRACKED
    with pytest.raises(ValueError, match="mapped to request"):
        ledger.track("t1", "r2", deadline=5.0, now=0.0)
    with pytest.raises(ValueError, match="already mapped"):
        ledger.track("t2", "r1", deadline=5.0, now=0.0)


def test_fail_releases_a_live_transfer_as_failed() -> None:
    ledger = ReleaseLedger()
    ledger.track("t1", "r1", deadline=5.0, now=0.0)
    assert ledger.fail("t1", "peer gone", now=1.0) is AckResult.RELEASED
    assert ledger.fail("t1", "again", now=1.0) is AckResult.DUPLICATE
    (released,) = ledger.pop_released()
    assert released.outcome is Outcome.FAILED


def test_terminal_memory_is_bounded() -> None:
    ledger = ReleaseLedger(terminal_capacity=1)
    for i in range(3):
        ledger.track(f"t{i}", f"r{i}", deadline=5.0, now=0.0)
        ledger.ack(f"t{i}", now=0.0)
    assert ledger.stats.terminal_evictions == 2
    # Released but unreported ids are still known, even once evicted from terminal memory.
    assert ledger.ack("t0", now=0.0) is AckResult.DUPLICATE
    assert ledger.track("t0", "r0", deadline=5.0, now=0.0) is TrackResult.TERMINAL
    assert len(ledger.pop_released()) == 3
    # After the report, an ACK for an evicted id is unknown: buffered (then aged out).
    assert ledger.ack("t0", now=0.0) is AckResult.BUFFERED


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"producer_tp": 0}, "producer_tp"),
        ({"max_buffered_acks": -1}, "max_buffered_acks"),
        ({"buffered_ack_ttl": 0.0}, "buffered_ack_ttl"),
        ({"terminal_capacity": 0}, "capacity"),
    ],
)
def test_constructor_validates_its_bounds(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ReleaseLedger(**kwargs)  # type: ignore[arg-type]
