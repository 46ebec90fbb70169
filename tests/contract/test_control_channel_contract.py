"""One contract for every ControlChannel: the in-memory fake and ZMQ on real loopback sockets,
without and with a shared secret (every frame then carries an HMAC tag, a nonce and a time).

The checks ship in :mod:`moriio.testing.contract`; this module supplies the ZMQ harness and runs
every check against each channel kind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from moriio.adapters.zmq import ZmqControlChannel
from moriio.ports import MessageCodec
from moriio.ports.control_channel import MsgT
from moriio.testing.contract import (
    CHANNEL_CHECKS,
    ChannelCheck,
    ChannelHarness,
    CountingChannel,
    InMemoryChannelHarness,
)


class ZmqHarness(ChannelHarness):
    """Real ZMQ channels on free loopback ports."""

    kind = "zmq"

    def create(
        self, codec: MessageCodec[MsgT], host: str, port: int, **options: Any
    ) -> CountingChannel[MsgT]:
        return ZmqControlChannel(codec, host, port, **options)


class ZmqSecretHarness(ZmqHarness):
    """ZMQ channels sharing one secret: every message is tagged and checked."""

    kind = "zmq+secret"
    secret = b"contract-secret-0123456789abcdef"

    def create(
        self, codec: MessageCodec[MsgT], host: str, port: int, **options: Any
    ) -> CountingChannel[MsgT]:
        return ZmqControlChannel(codec, host, port, secret=self.secret, **options)


HARNESSES: dict[str, Callable[[], ChannelHarness]] = {
    "inmemory": InMemoryChannelHarness,
    "zmq": ZmqHarness,
    "zmq+secret": ZmqSecretHarness,
}


@pytest.fixture(
    params=[
        "inmemory",
        pytest.param("zmq", marks=pytest.mark.integration),
        pytest.param("zmq+secret", marks=pytest.mark.integration),
    ]
)
def make_harness(request: pytest.FixtureRequest) -> Callable[[], ChannelHarness]:
    return HARNESSES[request.param]


@pytest.fixture
def harness(make_harness: Callable[[], ChannelHarness]) -> Iterator[ChannelHarness]:
    built = make_harness()
    try:
        yield built
    finally:
        built.close()


@pytest.mark.parametrize("check", CHANNEL_CHECKS, ids=lambda check: check.name)
def test_control_channel_contract(harness: ChannelHarness, check: ChannelCheck) -> None:
    check.run(harness)
