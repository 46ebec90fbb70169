"""The container composes an engine's scheduler half for every role and mode."""

from __future__ import annotations

import dataclasses

import pytest
from dependency_injector import providers

from moriio.adapters.clock import SystemClock
from moriio.config.settings import ConnectorSettings, parse_settings
from moriio.container import SchedulerContainer, SchedulerRole
from moriio.domain.params.transfer_params import TransferParams
from moriio.domain.scheduler.consumer.book import ConsumerBook
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.scheduler.producer.read_book import ReadProducerBook
from moriio.domain.scheduler.producer.write_book import WriteProducerBook
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import PROMPT
from moriio.testing.inmemory import FakeClock

ENDPOINT = LocalEndpoint("10.0.0.1:6301", "10.0.0.1", 6301, 61005, 1, 1, 0, "p#0")
ROLES = {
    "producer": SchedulerRole(is_producer=True, is_consumer=False),
    "consumer": SchedulerRole(is_producer=False, is_consumer=True),
    "both": SchedulerRole(is_producer=True, is_consumer=True),
}
PRODUCER_BOOKS = {TransferMode.READ: ReadProducerBook, TransferMode.WRITE: WriteProducerBook}


def _parts(mode: TransferMode, role: SchedulerRole) -> SchedulerContainer:
    return SchedulerContainer(
        settings=parse_settings({"read_mode": mode is TransferMode.READ, "transfer_timeout": 7}),
        role=role,
        endpoint=ENDPOINT,
        block_size=16,
    )


@pytest.mark.parametrize("mode", list(TransferMode))
@pytest.mark.parametrize("name", list(ROLES))
def test_each_role_gets_the_books_of_its_mode(mode: TransferMode, name: str) -> None:
    role = ROLES[name]
    parts = _parts(mode, role)
    producer, consumer = parts.producer(), parts.consumer()
    if role.is_producer:
        assert type(producer) is PRODUCER_BOOKS[mode]
        assert producer is parts.producer_book()  # one book per engine
    else:
        assert producer is None
    if role.is_consumer:
        assert isinstance(consumer, ConsumerBook)
        assert consumer is parts.consumer_book()
    else:
        assert consumer is None
    assert isinstance(parts.clock(), SystemClock)
    assert parts.policy() == parts.settings().transfer_policy()
    assert parts.policy().transfer_timeout == 7.0


def test_a_consumer_needs_no_endpoint() -> None:
    parts = SchedulerContainer(settings=ConnectorSettings(), role=ROLES["consumer"], block_size=16)
    assert parts.producer() is None
    assert isinstance(parts.consumer(), ConsumerBook)


def test_an_override_replaces_a_part() -> None:
    clock = FakeClock()
    parts = _parts(TransferMode.WRITE, ROLES["both"])
    book = ConsumerBook(TransferMode.WRITE, 32)
    parts.clock.override(providers.Object(clock))
    parts.consumer_book.override(providers.Object(book))
    assert parts.clock() is clock
    assert parts.consumer() is book
    assert isinstance(parts.producer(), WriteProducerBook)


def test_an_overridden_policy_reaches_the_producer_book() -> None:
    parts = _parts(TransferMode.READ, ROLES["producer"])
    policy = dataclasses.replace(parts.settings().transfer_policy(), defer_timeout=1.5)
    parts.policy.override(providers.Object(policy))
    book = parts.producer()
    assert book is not None
    params = TransferParams("tx", False, True, None, None)
    decision = book.on_finished(
        "p-1",
        length_capped=True,
        block_ids=([1, 2],),
        wall_now=100.0,
        now=0.0,
        params=params,
        prompt=PROMPT,
    )
    assert decision.params is not None
    assert decision.params["lease_expires_at"] == 101.5
