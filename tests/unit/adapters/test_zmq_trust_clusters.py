"""Trust that works in clusters: CIDR ranges, host names re-resolved, checked before a dial."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_mock import MockerFixture

from moriio.adapters.zmq import ZmqControlChannel
from moriio.adapters.zmq import channel as zmq_channel
from moriio.adapters.zmq.resolve import CachedResolver, system_resolve
from moriio.adapters.zmq.trust import TrustList
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Release
from moriio.ports import PeerAddress, UntrustedPeerError


class FakeDns:
    """Names to addresses, changed at will; records every question."""

    def __init__(self, answers: dict[str, tuple[str, ...]]) -> None:
        self.answers = answers
        self.asked: list[str] = []

    def __call__(self, name: str) -> tuple[str, ...]:
        self.asked.append(name)
        return self.answers.get(name, ())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_cidr_range_trusts_every_address_in_it_and_nothing_else() -> None:
    trust = TrustList(["10.244.0.0/16", "fd00::/8"], resolve=FakeDns({}))
    assert "10.244.3.7" in trust
    assert "fd00::1" in trust
    assert "10.245.0.1" not in trust
    assert "fe80::1" not in trust
    assert "10.244.0.0/16" in trust.snapshot()
    with pytest.raises(UntrustedPeerError):
        trust.check(PeerAddress("10.245.0.1", 6301))
    assert trust.check(PeerAddress("10.244.3.7", 6301)) == PeerAddress("10.244.3.7", 6301)


def test_a_malformed_range_is_refused_at_start_up() -> None:
    with pytest.raises(ValueError, match="CIDR"):
        TrustList(["10.244.0.0/33"])


def test_a_trusted_name_follows_its_pod_to_a_new_address() -> None:
    dns = FakeDns({"prefill-0.prefill.ns.svc": ("10.244.1.5",)})
    clock = FakeClock()
    trust = TrustList(
        ["prefill-0.prefill.ns.svc"], resolve=CachedResolver(dns, ttl=30.0, clock=clock)
    )
    assert "prefill-0.prefill.ns.svc" in trust
    assert "10.244.1.5" in trust
    dns.answers["prefill-0.prefill.ns.svc"] = ("10.244.2.9",)  # the pod restarted
    assert "10.244.2.9" not in trust  # the cached answer still holds
    clock.now += 31.0
    assert "10.244.2.9" in trust
    assert "10.244.1.5" not in trust  # the old address is no longer the name's


def test_a_peer_named_by_an_untrusted_name_is_dialled_at_the_checked_address() -> None:
    dns = FakeDns({"decode-1.ns.svc": ("10.244.7.1",), "evil.example": ("10.244.7.2", "8.8.8.8")})
    trust = TrustList(["10.244.0.0/16"], resolve=dns)
    assert trust.check(PeerAddress("decode-1.ns.svc", 6301)) == PeerAddress("10.244.7.1", 6301)
    with pytest.raises(UntrustedPeerError):  # one address outside the range is enough
        trust.check(PeerAddress("evil.example", 6301))
    with pytest.raises(UntrustedPeerError):  # a name that does not resolve
        trust.check(PeerAddress("nowhere.example", 6301))


def test_resolution_is_cached_bounded_and_failures_are_asked_again_later() -> None:
    dns = FakeDns({"a.example": ("10.0.0.1",)})
    clock = FakeClock()
    resolver = CachedResolver(dns, ttl=30.0, negative_ttl=5.0, max_names=2, clock=clock)
    for _ in range(100):
        assert resolver("a.example") == ("10.0.0.1",)
        assert resolver("gone.example") == ()
    assert dns.asked == ["a.example", "gone.example"]
    clock.now += 6.0  # past the negative period, within the positive one
    resolver("gone.example")
    resolver("a.example")
    assert dns.asked == ["a.example", "gone.example", "gone.example"]
    resolver("c.example")  # a third name empties the table instead of growing it
    assert len(resolver._answers) <= 2
    assert resolver.lookups == 4


def test_the_system_resolver_answers_localhost_and_nothing_for_a_malformed_name() -> None:
    assert "127.0.0.1" in system_resolve("localhost") or "::1" in system_resolve("localhost")
    assert system_resolve("no such host..") == ()


def test_a_channel_refuses_an_address_outside_its_ranges_before_dialling(
    mocker: MockerFixture,
) -> None:
    channel: ZmqControlChannel[Any] = ZmqControlChannel(
        WIRE_CODEC, "127.0.0.1", 0, trusted_hosts=["10.244.0.0/16"]
    )
    dials = mocker.spy(zmq_channel, "connect_dealer")
    try:
        with pytest.raises(UntrustedPeerError):
            channel.send(PeerAddress("192.168.9.9", 6301), Release("t", 1))
        dials.assert_not_called()
        assert channel.open_peers == frozenset()
        channel.send(PeerAddress("10.244.0.9", 6301), Release("t", 1))  # queued, never refused
        dials.assert_called_once_with(
            mocker.ANY, PeerAddress("10.244.0.9", 6301), mocker.ANY, mocker.ANY
        )
        assert PeerAddress("10.244.0.9", 6301) in channel.open_peers
    finally:
        channel.close()


def test_a_channel_listening_on_all_interfaces_does_not_trust_the_wildcard() -> None:
    channel: ZmqControlChannel[Any] = ZmqControlChannel(
        WIRE_CODEC, "0.0.0.0", 0, advertise_host="127.0.0.1"
    )
    try:
        assert "0.0.0.0" not in channel.trusted_hosts
        assert channel.address.host == "127.0.0.1"
        with pytest.raises(UntrustedPeerError):
            channel.send(PeerAddress("0.0.0.0", channel.address.port), Release("t", 1))
    finally:
        channel.close()
