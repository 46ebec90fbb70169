"""InMemoryControlChannel keeps the ControlChannel contract and injects seeded faults."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from moriio.ports import (
    ControlChannel,
    ControlChannelError,
    Inbound,
    MalformedMessageError,
    PeerAddress,
    RequestTimeoutError,
    UntrustedPeerError,
)
from moriio.testing.inmemory.channel import (
    FaultPlan,
    InMemoryControlChannel,
    InMemoryNetwork,
    Sent,
)
from moriio.testing.inmemory.clock import FakeClock

Msg = dict[str, Any]


class DictCodec:
    """Test codec: dict messages with a known "type" and an int "seq"."""

    def encode(self, message: Msg) -> Mapping[str, Any]:
        return message

    def decode(self, raw: object) -> Msg:
        if not isinstance(raw, dict):
            raise MalformedMessageError("not_a_map", type(raw).__name__)
        if raw.get("type") not in {"ping", "hello"}:
            raise MalformedMessageError("unknown_type", repr(raw.get("type")))
        if not isinstance(raw.get("seq"), int):
            raise MalformedMessageError("bad_field", "seq must be an int")
        return dict(raw)


def ping(seq: int, **extra: Any) -> Msg:
    return {"type": "ping", "seq": seq, **extra}


def make(
    network: InMemoryNetwork, host: str = "127.0.0.1", **kwargs: Any
) -> InMemoryControlChannel[Msg]:
    return InMemoryControlChannel(network, DictCodec(), host, **kwargs)


def seqs(inbound: list[Inbound[Msg]]) -> list[int]:
    return [i.message["seq"] for i in inbound]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def network(clock: FakeClock) -> InMemoryNetwork:
    return InMemoryNetwork(clock=clock)


def test_satisfies_the_port_and_allocates_distinct_ports(network: InMemoryNetwork) -> None:
    a: ControlChannel[Msg] = make(network)
    b = make(network)
    assert a.address != b.address
    assert a.address.host == "127.0.0.1"


def test_explicit_port_in_use_is_refused(network: InMemoryNetwork) -> None:
    make(network, port=5000)
    with pytest.raises(ValueError, match="already in use"):
        make(network, port=5000)


def test_send_delivers_a_wire_copy_with_sender_and_records_sent(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    original = ping(1, blocks=(3, 4))
    a.send(b.address, original)
    [inbound] = b.drain()
    assert inbound.sender == a.address
    assert inbound.message == {"type": "ping", "seq": 1, "blocks": [3, 4]}  # msgpack: lists
    assert inbound.message is not original
    assert a.sent == [Sent(b.address, original)]
    assert b.drain() == []


def test_untrusted_host_is_refused_and_not_recorded(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network, host="10.0.0.2")
    with pytest.raises(UntrustedPeerError, match=r"10\.0\.0\.2"):
        a.send(b.address, ping(1))
    with pytest.raises(UntrustedPeerError, match=r"10\.0\.0\.2"):
        a.request(b.address, ping(1), timeout=1.0)
    assert a.sent == []
    assert a.requests == []
    a.trust("10.0.0.2")
    a.send(b.address, ping(2))
    assert seqs(b.drain()) == [2]
    c = make(network, trusted_hosts=["10.0.0.2"])
    c.send(b.address, ping(3))
    assert seqs(b.drain()) == [3]


def test_malformed_messages_are_counted_at_the_receiver(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    a.send(b.address, {"type": "unknown", "seq": 1})
    network.inject(b.address, [1, 2, 3])
    network.inject(b.address, {"type": "ping", "seq": "one"})
    a.send(b.address, ping(4))
    assert seqs(b.drain()) == [4]
    assert b.rejected == {"invalid_message": 3}


def test_inbox_overflow_is_counted(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network, inbox_limit=2)
    for seq in range(5):
        a.send(b.address, ping(seq))
    assert b.rejected == {"inbox_overflow": 3}
    assert seqs(b.drain()) == [0, 1]


def test_send_to_absent_peer_is_counted(network: InMemoryNetwork) -> None:
    a = make(network)
    nowhere = PeerAddress("127.0.0.1", 9)
    a.send(nowhere, ping(1))
    a.send(nowhere, ping(2))
    assert a.dropped_sends == {nowhere: 2}
    assert len(a.sent) == 2


def test_oversize_message_is_refused_by_the_sender(network: InMemoryNetwork) -> None:
    a, b = make(network, max_frame_bytes=64), make(network)
    with pytest.raises(ValueError, match="max_frame_bytes"):
        a.send(b.address, ping(1, pad="x" * 100))


def test_request_reply_through_both_codecs(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    b.serve(lambda m: {"type": "hello", "seq": m["seq"] * 2})
    assert a.request(b.address, ping(21), timeout=1.0) == {"type": "hello", "seq": 42}
    assert a.requests == [Sent(b.address, ping(21))]


def test_request_failures_raise_and_count(network: InMemoryNetwork, clock: FakeClock) -> None:
    a, b = make(network), make(network)
    with pytest.raises(ControlChannelError, match="no responder"):
        a.request(b.address, ping(1), timeout=1.0)

    def broken(message: Msg) -> Msg:
        raise RuntimeError("boom")

    b.serve(broken)
    with pytest.raises(ControlChannelError, match="responder failed"):
        a.request(b.address, ping(1), timeout=1.0)
    b.serve(lambda m: {"type": "bogus"})
    with pytest.raises(ControlChannelError, match="malformed reply"):
        a.request(b.address, ping(1), timeout=1.0)
    assert b.rejected == {"unserved_request": 1, "responder_error": 1}
    assert a.rejected == {"invalid_message": 1}
    assert clock.now() == 0.0


def test_request_to_absent_peer_times_out_and_advances_clock(
    network: InMemoryNetwork, clock: FakeClock
) -> None:
    a = make(network)
    with pytest.raises(RequestTimeoutError):
        a.request(PeerAddress("127.0.0.1", 9), ping(1), timeout=2.5)
    assert clock.now() == 2.5


def test_drop_next_loses_exactly_n(network: InMemoryNetwork, clock: FakeClock) -> None:
    a, b = make(network), make(network)
    b.serve(lambda m: m)
    a.drop_next(2)
    a.send(b.address, ping(1))
    with pytest.raises(RequestTimeoutError):
        a.request(b.address, ping(2), timeout=3.0)
    a.send(b.address, ping(3))
    assert seqs(b.drain()) == [3]
    assert a.lost == 2
    assert clock.now() == 3.0


class Marked(dict[str, Any]):
    """A message of its own kind (for drops that target one kind)."""


def test_drop_next_of_a_kind_spares_other_traffic(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    a.drop_next(1, Marked)
    a.send(b.address, ping(1))
    a.send(b.address, Marked(ping(2)))
    a.send(b.address, Marked(ping(3)))
    assert seqs(b.drain()) == [1, 3]
    assert a.lost == 1


def test_drop_probability_is_seeded(network: InMemoryNetwork) -> None:
    def run(seed: int) -> list[int]:
        sender, receiver = make(network, seed=seed), make(network)
        sender.faults = FaultPlan(drop=0.5)
        for seq in range(200):
            sender.send(receiver.address, ping(seq))
        return seqs(receiver.drain())

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    assert 50 < len(first) < 150


def test_duplicate_delivers_twice(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    a.faults = FaultPlan(duplicate=1.0)
    a.send(b.address, ping(1))
    assert seqs(b.drain()) == [1, 1]


def test_reorder_permutes_but_keeps_every_message(network: InMemoryNetwork) -> None:
    a, b = make(network, seed=3), make(network)
    a.faults = FaultPlan(reorder=0.5)
    for seq in range(50):
        a.send(b.address, ping(seq))
    got = seqs(b.drain())
    assert sorted(got) == list(range(50))
    assert got != list(range(50))


def test_delay_holds_messages_until_the_clock_passes(
    network: InMemoryNetwork, clock: FakeClock
) -> None:
    a, b = make(network), make(network)
    a.faults = FaultPlan(delay=1.0)
    a.send(b.address, ping(1))
    a.faults = FaultPlan()
    a.send(b.address, ping(2))
    assert seqs(b.drain()) == [2]
    clock.advance(0.999)
    assert b.drain() == []
    clock.advance(0.001)
    assert seqs(b.drain()) == [1]


def test_delayed_request_times_out_or_takes_its_delay(
    network: InMemoryNetwork, clock: FakeClock
) -> None:
    a, b = make(network), make(network)
    b.serve(lambda m: m)
    a.faults = FaultPlan(delay=0.5)
    assert a.request(b.address, ping(1), timeout=1.0)["seq"] == 1
    assert clock.now() == 0.5
    with pytest.raises(RequestTimeoutError):
        a.request(b.address, ping(2), timeout=0.5)
    assert clock.now() == 1.0


def test_delay_needs_a_clock() -> None:
    a = make(InMemoryNetwork())
    with pytest.raises(ValueError, match="clock"):
        a.faults = FaultPlan(delay=1.0)


@pytest.mark.parametrize(
    "kwargs", [{"drop": 1.5}, {"duplicate": -0.1}, {"reorder": 2.0}, {"delay": -1.0}]
)
def test_fault_plan_is_validated(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="FaultPlan"):
        FaultPlan(**kwargs)


def test_close_is_idempotent_and_leaves_the_network(network: InMemoryNetwork) -> None:
    a, b = make(network), make(network)
    a.send(b.address, ping(1))
    b.close()
    b.close()
    assert not b.listener_alive
    assert network.lookup(b.address) is None
    assert seqs(b.drain()) == [1]
    with pytest.raises(ControlChannelError, match="closed"):
        b.send(a.address, ping(2))
    a.send(b.address, ping(3))
    assert a.dropped_sends == {b.address: 1}


def test_domain_wire_codec_round_trips_through_the_fake(network: InMemoryNetwork) -> None:
    from moriio.domain.wire.codec import WireCodec
    from moriio.domain.wire.messages import Message, Release

    a: InMemoryControlChannel[Message] = InMemoryControlChannel(network, WireCodec())
    b: InMemoryControlChannel[Message] = InMemoryControlChannel(network, WireCodec())
    message = Release(transfer_id="t-1", consumer_tp_size=2)
    a.send(b.address, message)
    assert [i.message for i in b.drain()] == [message]
