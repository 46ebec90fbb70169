"""Releases are authenticated: a capability token, one ACK per consumer rank, no replays."""

from __future__ import annotations

import pytest

from moriio.domain.ledgers.release_ledger import AckResult, ReleaseLedger, TrackResult
from moriio.domain.params.orders import HoldOrder, ReadOrder, StepOrders
from moriio.domain.params.transfer_params import (
    PeerEndpoint,
    TransferParams,
    TransferParamsError,
    parse_transfer_params,
    with_token,
)
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Message, Release
from moriio.domain.scheduler.producer.book import LocalEndpoint, ProducerBook
from moriio.domain.scheduler.producer.read_book import ReadProducerBook
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.ports import PeerAddress
from moriio.testing.handoffs import PROMPT, signed_read
from moriio.testing.inmemory import FakeClock, InMemoryFabric, InMemoryNetwork
from moriio.testing.inmemory.channel import InMemoryControlChannel
from moriio.testing.stacks.stack import HOST
from support.worker_stacks import PRODUCER, worker_stack

TOKEN = "0123456789abcdef" * 2

# -- the ledger ----------------------------------------------------------------------------


def test_a_replayed_rank_never_completes_the_fan_in() -> None:
    ledger = ReleaseLedger(producer_tp=4)  # consumer TP 8: two consumer ranks per producer rank
    ledger.track("t", "r", deadline=10.0, now=0.0)
    assert ledger.ack("t", 1.0, 8, consumer_rank=3) is AckResult.COUNTED
    assert ledger.ack("t", 1.0, 8, consumer_rank=3) is AckResult.DUPLICATE
    assert ledger.ack("t", 1.0, 8, consumer_rank=3) is AckResult.DUPLICATE
    assert ledger.is_live("t")
    assert ledger.ack("t", 1.0, 8, consumer_rank=2) is AckResult.RELEASED
    assert ledger.stats.duplicates_ignored == 2


def test_buffered_duplicates_of_one_rank_count_once() -> None:
    ledger = ReleaseLedger(producer_tp=4)
    for _ in range(3):
        assert ledger.ack("t", 0.0, 8, consumer_rank=5) is AckResult.BUFFERED
    assert ledger.track("t", "r", deadline=10.0, now=0.0) is TrackResult.TRACKED
    assert ledger.ack_count("t") == 1


def test_acks_without_the_token_are_refused() -> None:
    ledger = ReleaseLedger()
    ledger.track("t", "r", deadline=10.0, now=0.0, token=TOKEN)
    assert ledger.ack("t", 1.0, 1, 0) is AckResult.REFUSED
    assert ledger.ack("t", 1.0, 1, 0, token="f" * 32) is AckResult.REFUSED
    assert ledger.is_live("t")
    assert ledger.ack("t", 1.0, 1, 0, token=TOKEN) is AckResult.RELEASED
    assert ledger.stats.refused == 2


def test_buffered_acks_are_checked_against_the_token_when_tracked() -> None:
    ledger = ReleaseLedger()
    ledger.ack("t", 0.0, 1, 0, token="forged")
    assert ledger.track("t", "r", deadline=10.0, now=0.0, token=TOKEN) is TrackResult.TRACKED
    assert ledger.stats.refused == 1
    ledger.ack("u", 0.0, 1, 0, token=TOKEN)
    assert ledger.track("u", "s", deadline=10.0, now=0.0, token=TOKEN) is TrackResult.RELEASED


def test_a_rank_outside_the_consumer_tp_is_an_error() -> None:
    ledger = ReleaseLedger(producer_tp=2)
    with pytest.raises(ValueError, match="rank"):
        ledger.ack("t", 0.0, 2, consumer_rank=2)


# -- the token in kv_transfer_params -------------------------------------------------------


def _book() -> ProducerBook:
    endpoint = LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0")
    return ReadProducerBook(endpoint, TransferPolicy(clock_skew_allowance=0.0))


def _handed_off(book: ProducerBook) -> tuple[HoldOrder, dict[str, object]]:
    params = TransferParams("tx", False, True, None, None)
    book.on_allocated("p-1", params)
    decision = book.on_finished(
        "p-1", length_capped=True, block_ids=[1, 2], wall_now=0, now=0, params=params, prompt=PROMPT
    )
    assert decision.params is not None
    return book.take_orders().holds[0], decision.params


def test_the_producer_mints_a_fresh_token_per_transfer_and_hands_it_out() -> None:
    book = _book()
    hold, returned = _handed_off(book)
    assert len(hold.token) == 32
    # The token rides in the engine id, followed by the hand-off's signature.
    assert returned["remote_engine_id"].startswith(with_token("10.0.0.1:6301", hold.token) + ".")
    # What a router copies (engine id, block ids, transfer id) is enough to carry it.
    copied = {k: returned[k] for k in ("remote_engine_id", "remote_block_ids", "transfer_id")}
    copied |= {"do_remote_prefill": True, "remote_host": "10.0.0.1"}
    copied |= {"remote_handshake_port": 6301, "remote_notify_port": 61005}
    parsed = parse_transfer_params(copied, "d-1")
    assert parsed is not None
    assert parsed.token == hold.token
    assert parsed.peer is not None
    assert parsed.peer.engine_id == "10.0.0.1:6301"
    other, _ = _handed_off(_book())
    assert other.token != hold.token


@pytest.mark.parametrize("engine_id", ["e#", "#" + TOKEN, "e#xyz", "e#" + TOKEN.upper()])
def test_malformed_tokens_are_rejected(engine_id: str) -> None:
    params = {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": engine_id}
    with pytest.raises(TransferParamsError, match="remote_engine_id"):
        parse_transfer_params(params, "r")


# -- through the workers -------------------------------------------------------------------


def test_forged_and_replayed_releases_never_free_held_blocks() -> None:
    clock = FakeClock()
    fabric, net = InMemoryFabric(), InMemoryNetwork(clock)
    producer, p_memory = worker_stack("producer#0", True, TransferMode.READ, clock, fabric, net)
    consumer, d_memory = worker_stack("consumer#0", False, TransferMode.READ, clock, fabric, net)
    p_memory.write(9, (3, 4), 0)
    # The hand-off as the producer signed it: its token is the signature's check tag.
    peer = PeerEndpoint(HOST, PRODUCER.handshake_port, PRODUCER.notify_port, 1)
    read = signed_read(ReadOrder("d-1", "tx-1", (1, 2), (3, 4), peer, None))
    token = read.token
    producer.service.start_step(StepOrders(holds=[HoldOrder("p-1", "tx-1", token)]), 0.0)

    attacker: InMemoryControlChannel[Message] = InMemoryControlChannel(net, WIRE_CODEC, "10.9.9.9")
    attacker.trust(HOST)
    notify = PeerAddress(HOST, PRODUCER.notify_port)
    attacker.send(notify, Release("tx-1", 1, 0))  # no token
    attacker.send(notify, Release("tx-1", 1, 0, "f" * 32))  # a guessed one
    assert producer.service.finish_step().finished_sending == set()
    assert producer.service.ctx.counters.releases_refused == 2

    # The real consumer reads, then releases with the token: the blocks are freed once.
    consumer.service.start_step(StepOrders(reads=[read]), 0.0)
    for layer in d_memory.layer_names:
        consumer.service.wait_for_layer(layer)
    assert consumer.service.finish_step().invalid_block_ids == set()
    assert d_memory.holds(9, (1, 2), 0)
    assert producer.service.finish_step().finished_sending == {"p-1"}
    released = [s.message for s in consumer.inner_channel.sent if isinstance(s.message, Release)]
    assert released == [Release("tx-1", 1, 0, token)]
    for _ in range(3):  # replays of the genuine release change nothing
        attacker.send(notify, released[0])
    assert producer.service.finish_step().finished_sending == set()
