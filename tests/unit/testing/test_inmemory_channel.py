"""InMemoryControlChannel: what only the fake promises (its records, its network, its clock).

What every ControlChannel promises is checked by tests/contract/test_control_channel_contract.py.
"""

from __future__ import annotations

from typing import Any

import pytest

from moriio.ports import ControlChannelError, PeerAddress, RequestTimeoutError, UntrustedPeerError
from moriio.testing.contract import Msg, PingCodec, ping
from moriio.testing.inmemory.channel import InMemoryControlChannel, InMemoryNetwork, Sent
from moriio.testing.inmemory.clock import FakeClock


def make(
    network: InMemoryNetwork, host: str = "127.0.0.1", **kwargs: Any
) -> InMemoryControlChannel[Msg]:
    return InMemoryControlChannel(network, PingCodec(), host, **kwargs)


def seqs(channel: InMemoryControlChannel[Msg]) -> list[int]:
    return [i.message["seq"] for i in channel.drain()]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def network(clock: FakeClock) -> InMemoryNetwork:
    return InMemoryNetwork(clock=clock)


def test_explicit_port_in_use_is_refused(network: InMemoryNetwork) -> None:
    make(network, port=5000)
    with pytest.raises(ValueError, match="already in use"):
        make(network, port=5000)


def test_accepted_sends_and_requests_are_recorded(network: InMemoryNetwork) -> None:
    a, b, far = make(network), make(network), make(network, host="10.0.0.2")
    with pytest.raises(UntrustedPeerError):
        a.send(far.address, ping(0))
    with pytest.raises(UntrustedPeerError):
        a.request(far.address, ping(0), timeout=1.0)
    assert a.sent == []
    assert a.requests == []
    original = ping(1, blocks=(3, 4))
    a.send(b.address, original)
    assert a.sent == [Sent(b.address, original)]
    b.serve(lambda m: {"type": "hello", "seq": m["seq"] * 2})
    assert a.request(b.address, ping(21), timeout=1.0) == {"type": "hello", "seq": 42}
    assert a.requests == [Sent(b.address, ping(21))]


def test_malformed_messages_are_counted_at_the_receiver(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    a.send(b.address, {"type": "unknown", "seq": 1})
    network.inject(b.address, [1, 2, 3])
    network.inject(b.address, {"type": "ping", "seq": "one"})
    a.send(b.address, ping(4))
    assert seqs(b) == [4]
    assert b.rejected == {"invalid_message": 3}


def test_send_to_absent_peer_is_counted(network: InMemoryNetwork) -> None:
    a = make(network)
    nowhere = PeerAddress("127.0.0.1", 9)
    a.send(nowhere, ping(1))
    a.send(nowhere, ping(2))
    assert a.dropped_sends == {nowhere: 2}
    assert len(a.sent) == 2


def test_only_a_request_nobody_answers_takes_clock_time(
    network: InMemoryNetwork, clock: FakeClock
) -> None:
    a, b = make(network), make(network)
    with pytest.raises(ControlChannelError, match="no responder"):
        a.request(b.address, ping(1), timeout=1.0)
    assert clock.now() == 0.0
    with pytest.raises(RequestTimeoutError):
        a.request(PeerAddress("127.0.0.1", 9), ping(1), timeout=2.5)
    assert clock.now() == 2.5


def test_close_leaves_the_network_and_keeps_undrained_messages(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    a.send(b.address, ping(1))
    b.close()
    assert network.lookup(b.address) is None
    assert seqs(b) == [1]
    a.send(b.address, ping(3))
    assert a.dropped_sends == {b.address: 1}
