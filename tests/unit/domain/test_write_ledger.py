from moriio.domain.ledgers import Outcome, ScheduleResult, WriteLedger


def _ledger_with(layers: list[str], tid: str = "t1", deadline: float = 10.0) -> WriteLedger:
    ledger = WriteLedger()
    for layer in layers:
        assert ledger.schedule(tid, layer, deadline) is ScheduleResult.SCHEDULED
    return ledger


def test_second_schedule_of_a_layer_is_ignored_and_reported() -> None:
    ledger = _ledger_with(["l0", "l1"])
    assert ledger.schedule("t1", "l0", 10.0) is ScheduleResult.DUPLICATE
    assert ledger.scheduled_layers("t1") == ("l0", "l1")
    assert ledger.stats.duplicate_schedules == 1


def test_seal_fixes_the_count_and_completion_finalizes_once() -> None:
    ledger = _ledger_with(["l0", "l1"])
    assert ledger.seal("t1") is None
    assert ledger.is_sealed("t1")
    assert ledger.complete("t1", "l0", succeeded=True) is None
    result = ledger.complete("t1", "l1", succeeded=True)
    assert result is not None
    assert result.outcome is Outcome.SUCCEEDED
    assert result.transfer_id == "t1"
    assert result.unfinished_layers == ()
    # Exactly once: later events for the finished transfer are ignored.
    assert ledger.complete("t1", "l1", succeeded=True) is None
    assert ledger.seal("t1") is None
    assert ledger.fail("t1", "late") is None
    assert ledger.expire(1e9) == []
    assert ledger.is_terminal("t1")
    assert not ledger.is_live("t1")


def test_writes_completed_before_the_seal_finalize_at_the_seal() -> None:
    ledger = _ledger_with(["l0", "l1"])
    assert ledger.complete("t1", "l0", succeeded=True) is None
    assert ledger.complete("t1", "l1", succeeded=True) is None  # not sealed yet
    result = ledger.seal("t1")
    assert result is not None
    assert result.ok


def test_sealed_transfer_takes_no_new_layers() -> None:
    ledger = _ledger_with(["l0"])
    ledger.seal("t1")
    assert ledger.schedule("t1", "l1", 10.0) is ScheduleResult.SEALED
    result = ledger.complete("t1", "l0", succeeded=True)
    assert result is not None
    assert result.ok


def test_a_failed_write_finalizes_at_once_as_failure() -> None:
    ledger = _ledger_with(["l0", "l1", "l2"])
    result = ledger.complete("t1", "l1", succeeded=False, message="qp error")
    assert result is not None
    assert result.outcome is Outcome.FAILED
    assert "l1" in result.message
    assert "qp error" in result.message
    assert result.unfinished_layers == ("l0", "l2")
    assert ledger.complete("t1", "l0", succeeded=True) is None
    assert ledger.stats.failed == 1


def test_no_schedule_for_a_terminal_transfer() -> None:
    ledger = _ledger_with(["l0"])
    ledger.fail("t1", "consumer released")
    assert ledger.schedule("t1", "l0", 10.0) is ScheduleResult.TERMINAL
    assert ledger.schedule("t1", "l1", 10.0) is ScheduleResult.TERMINAL
    assert not ledger.is_live("t1")
    assert ledger.scheduled_layers("t1") == ()


def test_failing_an_unknown_transfer_refuses_its_later_schedules() -> None:
    ledger = WriteLedger()
    result = ledger.fail("t9", "released before the forward")
    assert result is not None
    assert result.outcome is Outcome.FAILED
    assert ledger.schedule("t9", "l0", 10.0) is ScheduleResult.TERMINAL


def test_completions_for_unknown_or_unscheduled_layers_are_ignored() -> None:
    ledger = _ledger_with(["l0"])
    ledger.seal("t1")
    assert ledger.complete("t1", "other", succeeded=True) is None
    assert ledger.complete("nope", "l0", succeeded=False) is None
    assert ledger.is_live("t1")
    assert ledger.stats.ignored_completions == 2


def test_seal_of_an_unknown_transfer_does_nothing() -> None:
    ledger = WriteLedger()
    assert ledger.seal("t1") is None
    assert not ledger.is_live("t1")


def test_expire_finalizes_only_transfers_past_their_deadline() -> None:
    ledger = WriteLedger()
    ledger.schedule("a", "l0", 5.0)
    ledger.schedule("b", "l0", 8.0)
    ledger.seal("a")
    assert ledger.expire(4.9) == []
    expired = ledger.expire(5.0)
    assert [r.transfer_id for r in expired] == ["a"]
    assert expired[0].outcome is Outcome.EXPIRED
    assert expired[0].unfinished_layers == ("l0",)
    assert "0/1 writes" in expired[0].message
    assert ledger.is_live("b")
    assert ledger.stats.expired == 1


def test_set_deadline_moves_the_expiry() -> None:
    ledger = _ledger_with(["l0"], deadline=5.0)
    assert ledger.set_deadline("t1", 50.0)
    assert ledger.deadline("t1") == 50.0
    assert ledger.expire(10.0) == []
    assert not ledger.set_deadline("unknown", 1.0)


def test_terminal_memory_is_bounded() -> None:
    ledger = WriteLedger(terminal_capacity=2)
    for tid in ("a", "b", "c"):
        ledger.fail(tid, "x")
    assert ledger.stats.terminal_evictions == 1
    assert not ledger.is_terminal("a")
    assert ledger.is_terminal("c")
