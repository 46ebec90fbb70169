"""ZmqControlChannel over real ZMQ sockets on loopback: what only this adapter promises.

What every ControlChannel promises is checked by tests/contract/test_control_channel_contract.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
import zmq
from pytest_mock import MockerFixture

from moriio.adapters.zmq import FrameLimits, ZmqControlChannel, framing
from moriio.adapters.zmq import channel as zmq_channel
from moriio.adapters.zmq import requests as zmq_requests
from moriio.ports import ControlChannelError, PeerAddress, RequestTimeoutError, UntrustedPeerError
from moriio.testing.contract import Msg, PingCodec, ping, receive
from support.zmq_dealers import Dealers, raw_dealers

pytestmark = pytest.mark.integration

SECRET = b"s" * 32
OTHER_SECRET = b"o" * 32
HOST = "127.0.0.1"


Factory = Callable[..., ZmqControlChannel[Msg]]


@pytest.fixture
def make_channel() -> Iterator[Factory]:
    made: list[ZmqControlChannel[Msg]] = []

    def make(host: str = HOST, **kwargs: Any) -> ZmqControlChannel[Msg]:
        channel = ZmqControlChannel(PingCodec(), host, 0, **kwargs)
        made.append(channel)
        return channel

    yield make
    for channel in made:
        channel.close()


@pytest.fixture
def raw_dealer() -> Iterator[Dealers]:
    yield from raw_dealers()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def envelope_frames(body: object, kind: str = "m", secret: bytes | None = None) -> list[bytes]:
    payload = msgpack.packb(
        {
            "v": framing.WIRE_VERSION,
            "k": kind,
            "c": 0,
            "f": None,
            "n": os.urandom(framing.NONCE_BYTES),
            "t": time.time(),
            "b": body,
        }
    )
    return [payload] if secret is None else [payload, framing.sign(secret, payload)]


def unused_address() -> PeerAddress:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    port = sock.bind_to_random_port(f"tcp://{HOST}")
    ctx.destroy(linger=0)
    return PeerAddress(HOST, port)


def test_request_to_silent_peer_times_out_and_drops_its_socket(make_channel: Factory) -> None:
    a = make_channel()
    dead = unused_address()
    with pytest.raises(RequestTimeoutError, match=str(dead)):
        a.request(dead, {"type": "ping", "seq": 1}, timeout=0.2)
    assert dead not in a.open_peers


def test_untrusted_host_is_refused_before_any_socket(
    make_channel: Factory, mocker: MockerFixture
) -> None:
    a = make_channel()
    b = make_channel(host="127.0.0.2")
    dials = mocker.spy(zmq_channel, "connect_dealer")
    request_dials = mocker.spy(zmq_requests, "connect_dealer")
    with pytest.raises(UntrustedPeerError, match=r"127\.0\.0\.2"):
        a.send(b.address, ping(1))
    with pytest.raises(UntrustedPeerError, match=r"127\.0\.0\.2"):
        a.request(b.address, ping(1), timeout=1.0)
    dials.assert_not_called()
    request_dials.assert_not_called()
    assert a.open_peers == frozenset()

    a.trust("127.0.0.2")
    a.send(b.address, ping(2))
    assert receive(b, 1) == [ping(2)]
    dials.assert_called_once_with(a._ctx, b.address, mocker.ANY, mocker.ANY)
    assert b.address in a.open_peers
    assert a.trusted_hosts == {"127.0.0.1", "127.0.0.2"}


def test_hmac_matching_secret_is_accepted(make_channel: Factory) -> None:
    a, b = make_channel(secret=SECRET), make_channel(secret=SECRET)
    b.serve(lambda m: m)
    a.send(b.address, {"type": "ping", "seq": 1})
    assert receive(b, 1) == [{"type": "ping", "seq": 1}]
    assert a.request(b.address, {"type": "ping", "seq": 2}, timeout=5.0)["seq"] == 2
    assert b.rejected == {}


def test_hmac_rejects_wrong_missing_and_unexpected_tags(make_channel: Factory) -> None:
    b = make_channel(secret=SECRET)
    make_channel(secret=OTHER_SECRET).send(b.address, {"type": "ping", "seq": 1})
    make_channel().send(b.address, {"type": "ping", "seq": 2})
    wait_until(lambda: b.rejected.get("bad_hmac") == 1 and b.rejected.get("missing_hmac") == 1)
    assert b.drain() == []

    plain = make_channel()
    make_channel(secret=SECRET).send(plain.address, {"type": "ping", "seq": 3})
    wait_until(lambda: plain.rejected.get("unexpected_hmac") == 1)
    assert plain.drain() == []


def test_secret_shorter_than_16_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        ZmqControlChannel(PingCodec(), HOST, 0, secret=b"short")


def test_oversize_frame_is_rejected_before_decoding(
    make_channel: Factory, raw_dealer: Dealers
) -> None:
    b = make_channel(max_frame_bytes=1024)
    sock = raw_dealer(b.address)  # keep a reference: a collected socket drops its queue
    sock.send(b"\xdd\xff\xff\xff\xff" + b"\x00" * 1500)
    wait_until(lambda: b.rejected.get("oversize") == 1)
    a = make_channel()
    a.send(b.address, {"type": "ping", "seq": 9})
    assert receive(b, 1) == [{"type": "ping", "seq": 9}]


def test_malformed_frames_are_counted_by_reason(make_channel: Factory, raw_dealer: Dealers) -> None:
    b = make_channel()
    sock = raw_dealer(b.address)
    sock.send(b"\xc1")  # never-used msgpack byte
    sock.send(b"\xdd\xff\xff\xff\xff")  # array of 4 billion elements in 5 bytes
    sock.send(msgpack.packb([1, 2, 3]))  # not an envelope
    sock.send_multipart(envelope_frames({"type": "nope", "seq": 1}))  # codec rejects
    sock.send_multipart([b"a", b"b", b"c"])  # too many frames
    wait_until(lambda: sum(b.rejected.values()) == 5)
    assert b.rejected == {
        "bad_msgpack": 2,
        "bad_envelope": 1,
        "invalid_message": 1,
        "bad_frames": 1,
    }
    sock.send_multipart(envelope_frames({"type": "ping", "seq": 5}))
    assert receive(b, 1) == [{"type": "ping", "seq": 5}]
    assert b.listener_alive


def test_rejection_is_logged_with_its_reason(
    raw_dealer: Dealers,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through stdlib logging (the process owner decides where it goes), with its reason."""
    caplog.set_level(logging.WARNING, logger="moriio.zmq")
    b = ZmqControlChannel(PingCodec(), HOST, 0)
    try:
        sock = raw_dealer(b.address)
        sock.send(b"\xc1")
        wait_until(lambda: b.rejected.get("bad_msgpack") == 1)
    finally:
        b.close()
    rejected = [r for r in caplog.records if "control message rejected" in r.getMessage()]
    assert len(rejected) == 1
    assert rejected[0].name == "moriio.zmq"
    assert rejected[0].levelno == logging.WARNING
    assert "reason='bad_msgpack'" in rejected[0].getMessage()
    assert "source='127.0.0.1" in rejected[0].getMessage()


def test_send_to_unreachable_peer_never_blocks_and_counts_drops(make_channel: Factory) -> None:
    a = make_channel(send_hwm=2)
    dead = unused_address()
    for seq in range(10):
        a.send(dead, {"type": "ping", "seq": seq})
    assert a.dropped_sends[dead] == 8


def test_a_closed_channel_drains_nothing_without_raising(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()
    a.send(b.address, {"type": "ping", "seq": 1})
    assert receive(b, 1) == [{"type": "ping", "seq": 1}]
    b.close()
    assert b.drain(timeout=0.5) == []


def test_responder_may_close_its_own_channel(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()

    def close_then_answer(message: Msg) -> Msg:
        b.close()
        return message

    b.serve(close_then_answer)
    with contextlib.suppress(RequestTimeoutError):  # the reply may go down with the socket
        a.request(b.address, {"type": "ping", "seq": 1}, timeout=0.5)
    wait_until(lambda: not b._listener._thread.is_alive())
    assert not b.listener_alive
    b.close()


def test_advertised_host_is_the_address_peers_see(make_channel: Factory) -> None:
    a = make_channel(advertise_host="localhost")
    b = make_channel(trusted_hosts=["localhost"])
    assert a.address.host == "localhost"
    b.send(a.address, {"type": "ping", "seq": 1})
    assert receive(a, 1) == [{"type": "ping", "seq": 1}]


def test_max_frame_bytes_and_limits_must_agree() -> None:
    with pytest.raises(ValueError, match="contradicts"):
        ZmqControlChannel(
            PingCodec(), HOST, 0, max_frame_bytes=100, limits=FrameLimits(max_frame_bytes=200)
        )


def test_port_in_use_is_a_clear_error(make_channel: Factory) -> None:
    taken = make_channel().address
    with pytest.raises(ControlChannelError, match=f"cannot listen on {HOST}:{taken.port}"):
        ZmqControlChannel(PingCodec(), HOST, taken.port)


def test_frame_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        FrameLimits(max_frame_bytes=0)
