"""One live transfer id names one request's blocks on a producer, in both modes.

A WRITE request claims its id when it gets blocks (its push is ordered before it finishes);
a READ request claims it when it finishes, the only moment its blocks are handed off. A
router's retry under the same id (llm-d retries a prefill on a 5xx) is still handed off.
"""

from __future__ import annotations

import pytest

from moriio.domain.params.transfer_params import MAX_TRANSFER_ID_LEN, TransferParams
from moriio.domain.scheduler.producer.book import FinishDecision, LocalEndpoint, ProducerBook
from moriio.domain.scheduler.producer.by_mode import producer_book
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import PROMPT

PARAMS = TransferParams("tx-1", False, True, None, None)
MODES = pytest.mark.parametrize("mode", list(TransferMode))


def _book(mode: TransferMode) -> ProducerBook:
    endpoint = LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0")
    return producer_book(mode, endpoint, TransferPolicy(clock_skew_allowance=0.0))


def _finish(book: ProducerBook, request_id: str) -> FinishDecision:
    if book.is_pending_save(request_id):
        book.on_scheduled(request_id, True, [1, 2])
    return book.on_finished(
        request_id,
        length_capped=True,
        block_ids=[1, 2],
        wall_now=0.0,
        now=0.0,
        params=PARAMS,
        prompt=PROMPT,
    )


def _start(book: ProducerBook, request_id: str) -> bool:
    return book.on_allocated(request_id, PARAMS)


def test_a_read_retry_finishing_under_a_held_id_is_handed_off_under_its_own() -> None:
    book = _book(TransferMode.READ)
    first = _finish(book, "p-1")
    retry = _finish(book, "p-2")
    again = _finish(book, "p-3")
    decisions = (first, retry, again)
    ids = {d.params["transfer_id"] for d in decisions if d.params is not None}
    assert first.params is not None
    assert first.params["transfer_id"] == "tx-1"
    assert retry.params is not None
    assert again.params is not None
    assert len(ids) == 3
    assert all(tid.startswith("tx-1~") for tid in ids - {"tx-1"})
    holds = book.take_orders().holds
    assert [(h.request_id, h.transfer_id) for h in holds] == [
        ("p-1", "tx-1"),
        ("p-2", retry.params["transfer_id"]),
        ("p-3", again.params["transfer_id"]),
    ]
    assert len({h.token for h in holds}) == 3  # each attempt is released by its own decode
    book.on_connector_output({"p-1"}, now=1.0)
    assert book.num_held == 2


def test_a_read_retry_of_an_id_at_its_length_limit_stays_within_it() -> None:
    book = _book(TransferMode.READ)
    long_id = PARAMS._replace(transfer_id="x" * MAX_TRANSFER_ID_LEN)
    for request_id in ("p-1", "p-2"):
        retry = book.on_finished(
            request_id,
            length_capped=True,
            block_ids=[1],
            wall_now=0.0,
            now=0.0,
            params=long_id,
            prompt=PROMPT,
        )
    assert retry.params is not None
    assert len(retry.params["transfer_id"]) == MAX_TRANSFER_ID_LEN


def test_a_write_retry_takes_over_an_id_whose_push_is_not_ordered_yet() -> None:
    book = _book(TransferMode.WRITE)
    assert _start(book, "p-1")
    assert not book.on_allocated("p-2", PARAMS, lambda owner: False)  # another prompt
    assert not book.on_allocated("p-2", PARAMS)  # nothing tells it is a retry
    assert book.on_allocated("p-2", PARAMS, lambda owner: owner == "p-1")
    assert not book.is_pending_save("p-1")
    assert book.is_pending_save("p-2")
    # Preempted and allocated again, the superseded attempt does not take the id back.
    assert book.on_allocated("p-1", PARAMS, lambda owner: True)
    assert not book.is_pending_save("p-1")
    # The superseded attempt ends without a hand-off and without cancelling the transfer.
    ended = book.on_finished(
        "p-1",
        length_capped=False,
        block_ids=[1],
        wall_now=0.0,
        now=0.0,
        params=PARAMS,
        prompt=PROMPT,
    )
    assert ended == (False, None)
    assert _finish(book, "p-2").delay_free
    orders = book.take_orders()
    assert orders.drops == []
    assert [(o.request_id, o.transfer_id) for o in orders.saves] == [("p-2", "tx-1")]


def test_a_write_retry_is_refused_once_the_owner_s_push_is_ordered() -> None:
    book = _book(TransferMode.WRITE)
    assert _start(book, "p-1")
    book.on_scheduled("p-1", True, [1, 2])  # the owner's push serves the decode
    assert not book.on_allocated("p-2", PARAMS, lambda owner: True)
    assert _finish(book, "p-1").delay_free
    assert not book.on_allocated("p-3", PARAMS, lambda owner: True)  # held for p-1
    assert [o.request_id for o in book.take_orders().saves] == ["p-1"]


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
        "p-1",
        length_capped=False,
        block_ids=[1],
        wall_now=0.0,
        now=0.0,
        params=PARAMS,
        prompt=PROMPT,
    )
    assert not decision.delay_free
    assert _start(book, "p-2")
    assert _finish(book, "p-2").delay_free
