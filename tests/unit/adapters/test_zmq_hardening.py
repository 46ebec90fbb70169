"""ZmqControlChannel against hostile addresses, many targets and replayed frames."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq
from pytest_mock import MockerFixture

from moriio.adapters.zmq import ZmqControlChannel, framing
from moriio.adapters.zmq import channel as zmq_channel
from moriio.adapters.zmq import requests as zmq_requests
from moriio.adapters.zmq.framing import Envelope, FrameRejectedError, Kind, ReplayGuard
from moriio.adapters.zmq.trust import InvalidPeerError
from moriio.config.settings import parse_settings
from moriio.container import _zmq_channel
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.messages import Release
from moriio.ports import ControlChannelError, PeerAddress, UntrustedPeerError
from moriio.testing.contract import receive

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
SECRET = b"k" * 32

Factory = Callable[..., ZmqControlChannel[Any]]


@pytest.fixture
def make_channel() -> Iterator[Factory]:
    made: list[ZmqControlChannel[Any]] = []

    def make(**kwargs: Any) -> ZmqControlChannel[Any]:
        channel: ZmqControlChannel[Any] = ZmqControlChannel(WIRE_CODEC, HOST, 0, **kwargs)
        made.append(channel)
        return channel

    yield make
    for channel in made:
        channel.close()


@pytest.mark.parametrize(
    "host", ["127.0.0.1 ", " 127.0.0.1", "127.0.0.1\n", "127.0.0.1\x00", "", "a b", "[::1]"]
)
def test_malformed_hosts_are_port_errors_and_never_dialled(
    make_channel: Factory, host: str, mocker: MockerFixture
) -> None:
    a, b = make_channel(), make_channel()
    dials = [mocker.spy(zmq_channel, "connect_dealer"), mocker.spy(zmq_requests, "connect_dealer")]
    with pytest.raises(InvalidPeerError):
        a.send(PeerAddress(host, b.address.port), Release("t", 1))
    with pytest.raises(ControlChannelError):
        a.request(PeerAddress(host, b.address.port), Release("t", 1), timeout=0.5)
    for dial in dials:
        dial.assert_not_called()
    assert a.open_peers == frozenset()
    a.send(b.address, Release("t-ok", 1))  # the channel still works
    assert receive(b, 1) == [Release("t-ok", 1)]


@pytest.mark.parametrize("port", [0, -1, 65536, 10**6, True])
def test_ports_out_of_range_are_port_errors(make_channel: Factory, port: Any) -> None:
    with pytest.raises(InvalidPeerError):
        make_channel().send(PeerAddress(HOST, port), Release("t", 1))


def test_zmq_errors_surface_as_port_errors(make_channel: Factory, mocker: MockerFixture) -> None:
    a, b = make_channel(), make_channel()
    out_of_files = zmq.ZMQError(errno.EMFILE, "Too many open files")
    send_dial = mocker.patch.object(zmq_channel, "connect_dealer", side_effect=out_of_files)
    mocker.patch.object(zmq_requests, "connect_dealer", side_effect=out_of_files)
    with pytest.raises(ControlChannelError, match="Too many open files"):
        a.send(b.address, Release("t", 1))
    with pytest.raises(ControlChannelError, match="Too many open files"):
        a.request(b.address, Release("t", 1), timeout=0.5)
    mocker.stop(send_dial)
    a.send(b.address, Release("t-ok", 1))
    assert receive(b, 1) == [Release("t-ok", 1)]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _fds_settle_below(limit: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _open_fds() >= limit:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_thousands_of_targets_keep_file_descriptors_bounded(make_channel: Factory) -> None:
    a = make_channel(max_peer_sockets=32)
    before = _open_fds()
    for port in range(20_000, 21_100):
        a.send(PeerAddress(HOST, port), Release("t", 1))
    assert len(a.open_peers) == 32
    assert a.evicted_sockets == 1_100 - 32
    # libzmq's reaper thread closes an evicted socket's descriptors after close() returns
    assert _fds_settle_below(before + 200, timeout=10.0)  # one socket holds at least one
    b = make_channel()
    a.send(b.address, Release("t-ok", 1))
    assert receive(b, 1) == [Release("t-ok", 1)]


def test_request_sockets_are_bounded_too(make_channel: Factory) -> None:
    a = make_channel(max_peer_sockets=4)
    for port in range(21_200, 21_210):
        with pytest.raises(ControlChannelError):
            a.request(PeerAddress(HOST, port), Release("t", 1), timeout=0.01)
    b = make_channel()
    b.serve(lambda message: message)
    for _ in range(6):
        assert a.request(b.address, Release("t", 1), timeout=5.0) == Release("t", 1)
    assert len(a.open_peers) <= 4


def test_trust_any_dials_any_valid_host(make_channel: Factory) -> None:
    strict, open_ = make_channel(), make_channel(trust_any=True)
    with pytest.raises(UntrustedPeerError):
        strict.send(PeerAddress("10.11.12.13", 5000), Release("t", 1))
    open_.send(PeerAddress("10.11.12.13", 5000), Release("t", 1))
    assert "*" in open_.trusted_hosts
    with pytest.raises(InvalidPeerError):
        open_.send(PeerAddress("10.11.12.13 ", 5000), Release("t", 1))


def _signed(body: object, *, sent_at: float | None = None) -> list[bytes]:
    env = Envelope(Kind.MESSAGE, 0, None, body, sent_at=sent_at or time.time())
    return framing.encode(env, SECRET)


def test_signed_frames_replayed_are_refused(make_channel: Factory) -> None:
    b = make_channel(secret=SECRET)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{HOST}:{b.address.port}")
        frames = _signed(WIRE_CODEC.encode(Release("t-1", 1)))
        for _ in range(3):
            sock.send_multipart(frames)
        sock.send_multipart(_signed(WIRE_CODEC.encode(Release("t-old", 1)), sent_at=1e9))
        deadline = time.monotonic() + 10
        while sum(b.rejected.values()) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert receive(b, 1, timeout=0.5) == [Release("t-1", 1)]
        assert dict(b.rejected) == {"replayed": 2, "stale_frame": 1}
    finally:
        ctx.destroy(linger=0)


def test_replay_guard_stays_bounded_and_refuses_what_it_forgot() -> None:
    guard = ReplayGuard(window=10.0, capacity=3)
    envelopes = [
        Envelope(Kind.MESSAGE, 0, None, {}, nonce=bytes([i]) * 16, sent_at=100.0 + i)
        for i in range(5)
    ]
    for env in envelopes:
        guard.check(env, now=105.0)
    assert len(guard) == 3
    for env in envelopes:  # forgotten (0, 1) fall under the floor; remembered are replays
        with pytest.raises(FrameRejectedError):
            guard.check(env, now=105.0)
    guard.check(Envelope(Kind.MESSAGE, 0, None, {}, nonce=b"n" * 16, sent_at=106.0), 106.0)
    with pytest.raises(FrameRejectedError, match="window"):
        guard.check(Envelope(Kind.MESSAGE, 0, None, {}, nonce=b"m" * 16, sent_at=90.0), 106.0)


def test_envelope_nonce_and_time_are_validated() -> None:
    good = msgpack.unpackb(_signed({})[0])
    for key, bad in (("n", b"short"), ("n", None), ("t", 1), ("t", float("nan"))):
        raw = dict(good, **{key: bad})
        with pytest.raises(FrameRejectedError) as info:
            framing.parse_envelope(raw)
        assert info.value.reason is framing.Reason.BAD_ENVELOPE


def test_container_passes_trust_any_to_the_channel() -> None:
    settings = parse_settings({"trusted_remote_hosts": "*"})
    resource = _zmq_channel(HOST, HOST, 0, settings, None)
    channel = next(resource)
    try:
        assert "*" in channel.trusted_hosts
        channel.send(PeerAddress("10.11.12.13", 5000), Release("t", 1))  # no UntrustedPeerError
    finally:
        resource.close()
