"""One live transfer id names one request's blocks on a producer, in both modes."""

from __future__ import annotations

import pytest

from moriio.domain.scheduler.books import producer_book
from moriio.domain.scheduler.producer_book import LocalEndpoint, ProducerBook
from moriio.domain.wire.modes import TransferMode
from moriio.domain.wire.transfer_params import TransferParams

PARAMS = TransferParams("tx-1", False, True, None, None)
MODES = pytest.mark.parametrize("mode", list(TransferMode))


def _book(mode: TransferMode) -> ProducerBook:
    endpoint = LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0")
    return producer_book(mode, endpoint, lease_seconds=60.0, skew_seconds=0.0)


def _hand_off(book: ProducerBook, request_id: str) -> None:
    if book.is_pending_save(request_id):
        book.on_scheduled(request_id, True, [1, 2])
    decision = book.on_finished(
        request_id, length_capped=True, block_ids=[1, 2], wall_now=0.0, now=0.0
    )
    assert decision.delay_free


@MODES
def test_a_second_request_claiming_a_live_transfer_id_is_not_handed_off(
    mode: TransferMode,
) -> None:
    book = _book(mode)
    assert book.on_allocated("p-1", PARAMS)
    assert not book.on_allocated("p-2", PARAMS)
    assert book.num_tracked == 1
    assert not book.is_pending_save("p-2")
    _hand_off(book, "p-1")
    assert not book.on_allocated("p-3", PARAMS)  # held for p-1 until released
    orders = book.take_orders()
    assert {o.request_id for o in [*orders.holds, *orders.saves]} == {"p-1"}


@MODES
def test_the_id_is_free_again_once_its_request_is_released_or_expired(
    mode: TransferMode,
) -> None:
    book = _book(mode)
    assert book.on_allocated("p-1", PARAMS)
    _hand_off(book, "p-1")
    book.on_connector_output({"p-1"}, now=1.0)
    assert book.on_allocated("p-2", PARAMS)
    _hand_off(book, "p-2")
    assert book.on_connector_output(set(), now=1e6) == {"p-2"}  # its lease ran out
    assert book.on_allocated("p-3", PARAMS)


@MODES
def test_a_request_not_handed_off_frees_its_id(mode: TransferMode) -> None:
    book = _book(mode)
    assert book.on_allocated("p-1", PARAMS)
    decision = book.on_finished("p-1", length_capped=False, block_ids=[1], wall_now=0.0, now=0.0)
    assert not decision.delay_free
    assert book.on_allocated("p-2", PARAMS)
