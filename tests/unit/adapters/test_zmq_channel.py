"""ZmqControlChannel over real ZMQ sockets on loopback, in one process."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import msgpack
import pytest
import zmq

from moriio.adapters.zmq import FrameLimits, ZmqControlChannel, framing
from moriio.ports import (
    ControlChannel,
    ControlChannelError,
    MalformedMessageError,
    PeerAddress,
    RequestTimeoutError,
    UntrustedPeerError,
)

pytestmark = pytest.mark.integration

Msg = dict[str, Any]
SECRET = b"s" * 32
OTHER_SECRET = b"o" * 32
HOST = "127.0.0.1"


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


Factory = Callable[..., ZmqControlChannel[Msg]]


@pytest.fixture
def make_channel() -> Iterator[Factory]:
    made: list[ZmqControlChannel[Msg]] = []

    def make(host: str = HOST, **kwargs: Any) -> ZmqControlChannel[Msg]:
        channel = ZmqControlChannel(DictCodec(), host, 0, **kwargs)
        made.append(channel)
        return channel

    yield make
    for channel in made:
        channel.close()


@pytest.fixture
def raw_dealer() -> Iterator[Callable[[PeerAddress], zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()

    def connect(address: PeerAddress) -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(f"tcp://{address.host}:{address.port}")
        return sock

    yield connect
    ctx.destroy(linger=0)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def drain_n(channel: ZmqControlChannel[Msg], n: int) -> list[Msg]:
    got: list[Msg] = []
    deadline = time.monotonic() + 10.0
    while len(got) < n and time.monotonic() < deadline:
        got.extend(i.message for i in channel.drain(timeout=0.5))
    return got


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


def test_channel_satisfies_the_port(make_channel: Factory) -> None:
    channel: ControlChannel[Msg] = make_channel()
    assert channel.address.host == HOST
    assert channel.address.port > 0


def test_send_then_drain_delivers_in_order_with_sender(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()
    for seq in range(5):
        a.send(b.address, {"type": "ping", "seq": seq})
    inbound: list[Any] = []
    deadline = time.monotonic() + 10
    while len(inbound) < 5 and time.monotonic() < deadline:
        inbound.extend(b.drain(timeout=0.5))
    assert [i.message["seq"] for i in inbound] == [0, 1, 2, 3, 4]
    assert {i.sender for i in inbound} == {a.address}
    assert b.drain() == []


def test_drain_without_messages_returns_empty_list(make_channel: Factory) -> None:
    assert make_channel().drain(timeout=0.01) == []


def test_request_reply_round_trip(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()
    b.serve(lambda m: {"type": "hello", "seq": m["seq"] + 1})
    assert a.request(b.address, {"type": "ping", "seq": 41}, timeout=5.0) == {
        "type": "hello",
        "seq": 42,
    }
    assert a.request(b.address, {"type": "ping", "seq": 1}, timeout=5.0)["seq"] == 2


def test_request_without_responder_fails_fast_and_is_counted(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()
    with pytest.raises(ControlChannelError, match="no responder"):
        a.request(b.address, {"type": "ping", "seq": 1}, timeout=10.0)
    assert b.rejected["unserved_request"] == 1


def test_responder_exception_becomes_error_reply(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()

    def broken(message: Msg) -> Msg:
        raise RuntimeError("boom")

    b.serve(broken)
    with pytest.raises(ControlChannelError, match="responder failed"):
        a.request(b.address, {"type": "ping", "seq": 1}, timeout=10.0)
    assert b.rejected["responder_error"] == 1
    assert b.listener_alive
    b.serve(lambda m: m)
    assert a.request(b.address, {"type": "ping", "seq": 7}, timeout=5.0)["seq"] == 7


def test_request_to_silent_peer_times_out_and_drops_its_socket(make_channel: Factory) -> None:
    a = make_channel()
    dead = unused_address()
    with pytest.raises(RequestTimeoutError, match=str(dead)):
        a.request(dead, {"type": "ping", "seq": 1}, timeout=0.2)
    assert dead not in a.open_peers


def test_request_timeout_must_be_positive(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()
    with pytest.raises(ValueError, match="timeout"):
        a.request(b.address, {"type": "ping", "seq": 1}, timeout=0)


def test_untrusted_host_is_refused_before_any_socket(
    make_channel: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = make_channel()
    b = make_channel(host="127.0.0.2")

    def no_socket(*args: object, **kwargs: object) -> None:
        raise AssertionError("a socket was opened for an untrusted host")

    monkeypatch.setattr(a._ctx, "socket", no_socket)
    with pytest.raises(UntrustedPeerError, match=r"127\.0\.0\.2"):
        a.send(b.address, {"type": "ping", "seq": 1})
    with pytest.raises(UntrustedPeerError, match=r"127\.0\.0\.2"):
        a.request(b.address, {"type": "ping", "seq": 1}, timeout=1.0)
    assert a.open_peers == frozenset()
    monkeypatch.undo()

    a.trust("127.0.0.2")
    a.send(b.address, {"type": "ping", "seq": 2})
    assert drain_n(b, 1) == [{"type": "ping", "seq": 2}]
    assert b.address in a.open_peers


def test_configured_trusted_hosts_may_be_dialed(make_channel: Factory) -> None:
    b = make_channel(host="127.0.0.2")
    a = make_channel(trusted_hosts=["127.0.0.2"])
    a.send(b.address, {"type": "ping", "seq": 3})
    assert drain_n(b, 1) == [{"type": "ping", "seq": 3}]
    assert a.trusted_hosts == {"127.0.0.1", "127.0.0.2"}


def test_hmac_matching_secret_is_accepted(make_channel: Factory) -> None:
    a, b = make_channel(secret=SECRET), make_channel(secret=SECRET)
    b.serve(lambda m: m)
    a.send(b.address, {"type": "ping", "seq": 1})
    assert drain_n(b, 1) == [{"type": "ping", "seq": 1}]
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
        ZmqControlChannel(DictCodec(), HOST, 0, secret=b"short")


def test_oversize_frame_is_rejected_before_decoding(
    make_channel: Factory, raw_dealer: Callable[[PeerAddress], zmq.Socket[bytes]]
) -> None:
    b = make_channel(max_frame_bytes=1024)
    sock = raw_dealer(b.address)  # keep a reference: a collected socket drops its queue
    sock.send(b"\xdd\xff\xff\xff\xff" + b"\x00" * 1500)
    wait_until(lambda: b.rejected.get("oversize") == 1)
    a = make_channel()
    with pytest.raises(ControlChannelError, match="max_frame_bytes"):
        make_channel(max_frame_bytes=64).send(b.address, {"type": "ping", "seq": 1, "x": "y" * 99})
    a.send(b.address, {"type": "ping", "seq": 9})
    assert drain_n(b, 1) == [{"type": "ping", "seq": 9}]


def test_malformed_frames_are_counted_by_reason(
    make_channel: Factory, raw_dealer: Callable[[PeerAddress], zmq.Socket[bytes]]
) -> None:
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
    assert drain_n(b, 1) == [{"type": "ping", "seq": 5}]
    assert b.listener_alive


def test_rejection_is_logged_with_its_reason(
    raw_dealer: Callable[[PeerAddress], zmq.Socket[bytes]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Through stdlib logging (the process owner decides where it goes), with its reason."""
    caplog.set_level(logging.WARNING, logger="moriio.zmq")
    b = ZmqControlChannel(DictCodec(), HOST, 0)
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


def test_inbox_overflow_is_counted_not_silent(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel(inbox_limit=3)
    for seq in range(5):
        a.send(b.address, {"type": "ping", "seq": seq})
    wait_until(lambda: b.rejected.get("inbox_overflow") == 2)
    assert [i.message["seq"] for i in b.drain()] == [0, 1, 2]


def test_send_to_unreachable_peer_never_blocks_and_counts_drops(make_channel: Factory) -> None:
    a = make_channel(send_hwm=2)
    dead = unused_address()
    for seq in range(10):
        a.send(dead, {"type": "ping", "seq": seq})
    assert a.dropped_sends[dead] == 8


def test_close_is_idempotent_and_stops_everything(make_channel: Factory) -> None:
    a, b = make_channel(), make_channel()
    a.send(b.address, {"type": "ping", "seq": 1})
    assert drain_n(b, 1) == [{"type": "ping", "seq": 1}]
    alive_before_close = b.listener_alive
    b.close()
    b.close()
    assert alive_before_close
    assert not b.listener_alive
    assert b.drain(timeout=0.5) == []
    with pytest.raises(ControlChannelError, match="closed"):
        b.send(a.address, {"type": "ping", "seq": 2})
    with pytest.raises(ControlChannelError, match="closed"):
        b.request(a.address, {"type": "ping", "seq": 2}, timeout=1.0)


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
    assert drain_n(a, 1) == [{"type": "ping", "seq": 1}]


def test_max_frame_bytes_and_limits_must_agree() -> None:
    with pytest.raises(ValueError, match="contradicts"):
        ZmqControlChannel(
            DictCodec(), HOST, 0, max_frame_bytes=100, limits=FrameLimits(max_frame_bytes=200)
        )


def test_port_in_use_is_a_clear_error(make_channel: Factory) -> None:
    taken = make_channel().address
    with pytest.raises(ControlChannelError, match=f"cannot listen on {HOST}:{taken.port}"):
        ZmqControlChannel(DictCodec(), HOST, taken.port)


def test_port_zero_binds_distinct_ephemeral_ports(make_channel: Factory) -> None:
    assert make_channel().address != make_channel().address


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"port": -1}, "port"), ({"port": 70000}, "port"), ({"inbox_limit": 0}, "inbox_limit")],
)
def test_bad_configuration_is_refused(kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"port": 0} | kwargs
    port = args.pop("port")
    with pytest.raises(ValueError, match=match):
        ZmqControlChannel(DictCodec(), HOST, port, **args)


def test_frame_limits_are_validated() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes"):
        FrameLimits(max_frame_bytes=0)


def test_domain_wire_codec_messages_cross_the_channel() -> None:
    from moriio.domain.wire.codec import WireCodec
    from moriio.domain.wire.messages import HandshakeRejected, Message, Release

    a: ZmqControlChannel[Message] = ZmqControlChannel(WireCodec(), HOST, 0, secret=SECRET)
    b: ZmqControlChannel[Message] = ZmqControlChannel(WireCodec(), HOST, 0, secret=SECRET)
    try:
        b.serve(lambda m: HandshakeRejected(reason=f"got {type(m).__name__}"))
        a.send(b.address, Release("transfer-7", consumer_tp_size=4))
        inbound = b.drain(timeout=10.0)
        assert [i.message for i in inbound] == [Release("transfer-7", consumer_tp_size=4)]
        reply = a.request(b.address, Release("t", 1), timeout=10.0)
        assert reply == HandshakeRejected(reason="got Release")
    finally:
        a.close()
        b.close()
