import pytest

from moriio.domain.ledgers import Outcome, ReadLedger


def test_all_layers_succeeding_finishes_the_transfer_with_its_request_id() -> None:
    ledger = ReadLedger()
    assert ledger.start("t1", "req-1", ["l0", "l1"], deadline=10.0) is None
    assert ledger.pending_layers("t1") == ("l0", "l1")
    assert ledger.complete("t1", "l0", succeeded=True) is None
    assert ledger.pending_layers("t1") == ("l1",)
    result = ledger.complete("t1", "l1", succeeded=True)
    assert result is not None
    assert result.ok
    assert result.request_id == "req-1"
    assert ledger.complete("t1", "l1", succeeded=True) is None
    assert ledger.is_terminal("t1")


def test_any_failed_layer_makes_the_transfer_terminal() -> None:
    ledger = ReadLedger()
    ledger.start("t1", "req-1", ["l0", "l1", "l2"], deadline=10.0)
    result = ledger.complete("t1", "l0", succeeded=False, message="remote gone")
    assert result is not None
    assert result.outcome is Outcome.FAILED
    assert "remote gone" in result.message
    assert result.unfinished_layers == ("l1", "l2")
    assert ledger.transfers_waiting_on("l1") == ()
    assert ledger.stats.pending_layer_reads == 0


def test_transfers_waiting_on_a_layer_are_indexed_per_layer() -> None:
    ledger = ReadLedger()
    ledger.start("a", "ra", ["l0", "l1"], deadline=10.0)
    ledger.start("b", "rb", ["l0", "l1"], deadline=10.0)
    ledger.complete("a", "l0", succeeded=True)
    assert ledger.transfers_waiting_on("l0") == ("b",)
    assert ledger.transfers_waiting_on("l1") == ("a", "b")
    assert ledger.transfers_waiting_on("l9") == ()
    assert ledger.stats.pending_layer_reads == 3


def test_nothing_to_read_succeeds_at_once() -> None:
    ledger = ReadLedger()
    result = ledger.start("t1", "req-1", [], deadline=10.0)
    assert result is not None
    assert result.ok
    assert result.request_id == "req-1"
    assert ledger.stats.live == 0


def test_a_layer_read_from_two_producer_ranks_is_done_after_both() -> None:
    ledger = ReadLedger()
    ledger.start("t1", "r", ["l0", "l0", "l1"], deadline=10.0)
    assert ledger.pending_layers("t1") == ("l0", "l1")
    assert ledger.complete("t1", "l0", succeeded=True) is None
    assert ledger.transfers_waiting_on("l0") == ("t1",)  # the second batch still runs
    assert ledger.complete("t1", "l1", succeeded=True) is None
    result = ledger.complete("t1", "l0", succeeded=True)
    assert result is not None
    assert result.ok
    assert ledger.complete("t1", "l0", succeeded=True) is None  # a third one is ignored


def test_one_failed_batch_of_a_layer_read_from_two_ranks_fails_the_read() -> None:
    ledger = ReadLedger()
    ledger.start("t1", "r", ["l0", "l0"], deadline=10.0)
    result = ledger.complete("t1", "l0", succeeded=False, message="boom")
    assert result is not None
    assert not result.ok
    assert "boom" in result.message


def test_a_transfer_id_cannot_start_twice() -> None:
    ledger = ReadLedger()
    ledger.start("t1", "r", ["l0"], deadline=10.0)
    with pytest.raises(ValueError, match="already started"):
        ledger.start("t1", "r", ["l0"], deadline=10.0)
    ledger.fail("t1", "x")
    assert ledger.knows("t1")
    with pytest.raises(ValueError, match="already started"):
        ledger.start("t1", "r", ["l0"], deadline=10.0)


def test_expire_reports_partial_progress_and_frees_the_layer_index() -> None:
    ledger = ReadLedger()
    ledger.start("t1", "r", ["l0", "l1"], deadline=3.0)
    ledger.complete("t1", "l0", succeeded=True)
    assert ledger.expire(2.9) == []
    (result,) = ledger.expire(3.0)
    assert result.outcome is Outcome.EXPIRED
    assert "1/2" in result.message
    assert result.unfinished_layers == ("l1",)
    assert ledger.transfers_waiting_on("l1") == ()


def test_fail_is_ignored_for_transfers_that_are_not_live() -> None:
    ledger = ReadLedger()
    assert ledger.fail("nope", "x") is None
    ledger.start("t1", "r", ["l0"], deadline=3.0)
    assert ledger.set_deadline("t1", 30.0)
    assert ledger.expire(10.0) == []
    failed = ledger.fail("t1", "shutdown")
    assert failed is not None
    assert failed.transfer_id == "t1"
    assert ledger.stats.failed == 1
