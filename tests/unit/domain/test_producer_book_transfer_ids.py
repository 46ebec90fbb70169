"""One live transfer id names one request's blocks on a producer, in both modes.

A WRITE request claims its id when it gets blocks (its push is ordered before it finishes);
a READ request claims it when it finishes, the only moment its blocks are handed off.
"""

from __future__ import annotations

import pytest

from moriio.domain.scheduler.books import producer_book
from moriio.domain.scheduler.producer_book import FinishDecision, LocalEndpoint, ProducerBook
from moriio.domain.wire.modes import TransferMode
from moriio.domain.wire.transfer_params import TransferParams

PARAMS = TransferParams("tx-1", False, True, None, None)
MODES = pytest.mark.parametrize("mode", list(TransferMode))


def _book(mode: TransferMode) -> ProducerBook:
    endpoint = LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0")
    return producer_book(mode, endpoint, lease_seconds=60.0, skew_seconds=0.0)


def _finish(book: ProducerBook, request_id: str) -> FinishDecision:
    if book.is_pending_save(request_id):
        book.on_scheduled(request_id, True, [1, 2])
    return book.on_finished(
        request_id, length_capped=True, block_ids=[1, 2], wall_now=0.0, now=0.0, params=PARAMS
    )


def _start(book: ProducerBook, request_id: str) -> bool:
    return book.on_allocated(request_id, PARAMS)


@MODES
def test_a_second_request_claiming_a_live_transfer_id_is_not_handed_off(
    mode: TransferMode,
) -> None:
    book = _book(mode)
    assert _start(book, "p-1")
    second_started = _start(book, "p-2")
    assert second_started is (mode is TransferMode.READ)  # WRITE refuses it at allocation
    assert not book.is_pending_save("p-2")
    assert _finish(book, "p-1").delay_free
    second = _finish(book, "p-2")
    assert not second.delay_free
    assert second.params is None
    assert second.duplicate is (mode is TransferMode.READ)
    third_started = _start(book, "p-3")  # held for p-1 until released
    assert third_started is (mode is TransferMode.READ)
    assert _finish(book, "p-3").duplicate is (mode is TransferMode.READ)
    orders = book.take_orders()
    assert {o.request_id for o in [*orders.holds, *orders.saves]} == {"p-1"}
    assert book.num_held == 1


@MODES
def test_the_id_is_free_again_once_its_request_is_released_or_expired(
    mode: TransferMode,
) -> None:
    book = _book(mode)
    assert _start(book, "p-1")
    assert _finish(book, "p-1").delay_free
    book.on_connector_output({"p-1"}, now=1.0)
    assert _start(book, "p-2")
    assert _finish(book, "p-2").delay_free
    assert book.on_connector_output(set(), now=1e6) == {"p-2"}  # its lease ran out
    assert _start(book, "p-3")
    assert _finish(book, "p-3").delay_free


@MODES
def test_a_request_not_handed_off_frees_its_id(mode: TransferMode) -> None:
    book = _book(mode)
    assert _start(book, "p-1")
    # READ: not length capped; WRITE: its push was never ordered (it ended mid-prefill).
    decision = book.on_finished(
        "p-1", length_capped=False, block_ids=[1], wall_now=0.0, now=0.0, params=PARAMS
    )
    assert not decision.delay_free
    assert _start(book, "p-2")
    assert _finish(book, "p-2").delay_free
