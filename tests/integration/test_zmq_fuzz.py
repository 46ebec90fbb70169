"""Fuzz the ZMQ control listener: thousands of hostile frames, then a valid handshake."""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moriio.adapters.zmq import FrameLimits, ZmqControlChannel, framing
from moriio.adapters.zmq.framing import FrameRejectedError, Kind
from moriio.domain.protocol.codec import WireCodec
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import HandshakeReply, HandshakeRequest, Message, Release
from moriio.domain.values.modes import TransferMode
from moriio.ports import MalformedMessageError, PeerAddress
from support.zmq_dealers import Dealers, raw_dealers

HOST = "127.0.0.1"
MAX_FRAME = 8192
SECRET = b"k" * 32
CODEC = WireCodec()
FINGERPRINT = Fingerprint(
    model_name="tiny-model",
    dtype="bfloat16",
    block_size=16,
    layout_kinds=("separated", "separated"),
    tp_size=1,
    transfer_mode=TransferMode.READ,
    total_num_kv_heads=8,
    is_mla=False,
)
LAYERS = tuple(
    LayerRegions(
        name=f"layer.{i}", descriptors=(b"desc-k", b"desc-v"), num_blocks=64, block_len=4096
    )
    for i in range(2)
)


def handshake_request(control: PeerAddress) -> HandshakeRequest:
    return HandshakeRequest(
        fingerprint=FINGERPRINT,
        engine_metadata=b"engine-meta",
        layers=LAYERS,
        control=control,
        dp_rank=0,
        tp_rank=0,
        instance_id="requester-1",
    )


def responder(address: PeerAddress) -> Callable[[Message], Message]:
    def answer(message: Message) -> Message:
        assert isinstance(message, HandshakeRequest)
        FINGERPRINT.check_compatible(message.fingerprint)
        return HandshakeReply(
            fingerprint=FINGERPRINT,
            engine_metadata=b"listener-meta",
            layers=LAYERS,
            control=address,
            dp_rank=0,
            tp_rank=0,
            instance_id="listener-1",
        )

    return answer


def envelope(kind: str, body: object, correlation: int = 0) -> dict[str, Any]:
    return {
        "v": framing.WIRE_VERSION,
        "k": kind,
        "c": correlation,
        "f": [HOST, 5555],
        "n": b"n" * framing.NONCE_BYTES,
        "t": 1.0,
        "b": body,
    }


def packed(value: object) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


VALID_BODIES = [
    CODEC.encode(Release(transfer_id="t-1", consumer_tp_size=2)),
    CODEC.encode(handshake_request(PeerAddress(HOST, 5555))),
]
JUNK_FIELD_VALUES: dict[str, list[Any]] = {
    "v": ["2", 1, 3, 2.0, None, True, [2], {"v": 2}],
    "k": ["x", 1, None, b"m", ["m"], ""],
    "c": [-1, 2**64 - 1, "1", 1.5, None, True, [0]],
    "f": ["host:1", ["h"], ["h", 0], ["h", 70000], [1, 2], ["", 5], ["h", True], {"h": 1}],
    "n": [b"", b"x" * 15, b"x" * 17, "n" * 16, None, 1],
    "t": [1, None, "1.0", float("nan"), float("inf"), True],
    "b": [
        None,
        1,
        "text",
        [1, 2],
        {"type": "release"},
        {"v": 1, "type": "nope"},
        {"v": 1, "type": "release", "transfer_id": 5, "consumer_tp_size": 1},
        {"v": 1, "type": "release", "transfer_id": "t", "consumer_tp_size": -3},
        {"v": 2, "type": "write_done", "transfer_id": "t"},
        {"v": 1, "type": "remote_blocks", "block_ids": list(range(50))},
    ],
}


def hostile_frames(rng: random.Random) -> Iterator[tuple[str, list[bytes]]]:
    """(category, frames) for every kind of bad input; each is rejected exactly once."""
    for _ in range(1500):
        yield "random", [rng.randbytes(rng.randint(0, 256))]
    for _ in range(1000):
        frame = packed(envelope(rng.choice("mq"), rng.choice(VALID_BODIES), rng.randint(1, 99)))
        yield "truncated", [frame[: rng.randrange(len(frame))]]
    for _ in range(800):
        env = envelope("m", rng.choice(VALID_BODIES))
        field = rng.choice(sorted(JUNK_FIELD_VALUES))
        action = rng.random()
        if action < 0.1:
            del env[field]
        elif action < 0.2:
            env["extra"] = 1
        else:
            env[field] = rng.choice(JUNK_FIELD_VALUES[field])
        yield "wrong_types", [packed(env)]
    headers = [b"\xdd", b"\xdf", b"\xdb", b"\xc6", b"\xc9"]
    for _ in range(300):
        declared = struct.pack(">I", rng.randint(1 << 16, (1 << 32) - 1))
        prefix = rng.choice([b"", b"\x85\xa1v\x01\xa1b"])
        yield "huge_declared", [prefix + rng.choice(headers) + declared + rng.randbytes(4)]
    for _ in range(50):
        yield "deep", [b"\x91" * rng.randint(100, 5000) + b"\xc0"]
    for _ in range(50):
        yield "oversize", [rng.randbytes(rng.randint(MAX_FRAME + 1, 2 * MAX_FRAME))]
    for _ in range(200):
        yield "multipart", [rng.randbytes(rng.randint(0, 64)) for _ in range(rng.randint(2, 6))]
    for _ in range(300):
        body = {"v": 1, "type": rng.choice(["release", "write_done", "handshake_request"])}
        body |= {rng.choice(["transfer_id", "x", "layers"]): rng.choice([1, "", None, [b"x"]])}
        yield "invalid_body", [packed(envelope("m", body))]
    for _ in range(50):
        kind, reply = rng.choice([("r", VALID_BODIES[0]), ("e", "error text")])
        yield "stray_reply", [packed(envelope(kind, reply, rng.randint(1, 99)))]


@pytest.fixture
def channels() -> Iterator[list[ZmqControlChannel[Message]]]:
    made: list[ZmqControlChannel[Message]] = []
    yield made
    for channel in made:
        channel.close()


@pytest.fixture
def dealers() -> Iterator[Dealers]:
    yield from raw_dealers()


def wait_for_total(channel: ZmqControlChannel[Message], total: int) -> None:
    deadline = time.monotonic() + 60
    while sum(channel.rejected.values()) < total:
        assert time.monotonic() < deadline, f"only {dict(channel.rejected)} of {total} seen"
        time.sleep(0.02)


def assert_answers_handshake(
    listener: ZmqControlChannel[Message], channels: list[ZmqControlChannel[Message]], **kw: Any
) -> None:
    client: ZmqControlChannel[Message] = ZmqControlChannel(CODEC, HOST, 0, **kw)
    channels.append(client)
    reply = client.request(listener.address, handshake_request(client.address), timeout=10.0)
    assert isinstance(reply, HandshakeReply)
    assert reply.control == listener.address
    assert reply.layers == LAYERS


@pytest.mark.integration
def test_listener_survives_thousands_of_hostile_frames(
    channels: list[ZmqControlChannel[Message]],
    dealers: Dealers,
) -> None:
    listener: ZmqControlChannel[Message] = ZmqControlChannel(
        CODEC, HOST, 0, max_frame_bytes=MAX_FRAME
    )
    channels.append(listener)
    listener.serve(responder(listener.address))
    socks = [dealers(listener.address) for _ in range(4)]
    counts: dict[str, int] = {}
    rng = random.Random(20240611)
    frames = list(hostile_frames(rng))
    for i, (category, parts) in enumerate(frames):
        socks[i % len(socks)].send_multipart(parts)
        counts[category] = counts.get(category, 0) + 1

    wait_for_total(listener, len(frames))
    rejected = dict(listener.rejected)
    assert listener.listener_alive
    assert sum(rejected.values()) == len(frames) > 4000
    assert "listener_error" not in rejected
    assert set(rejected) <= {
        "bad_msgpack",
        "bad_envelope",
        "invalid_message",
        "oversize",
        "bad_frames",
        "unexpected_hmac",
        "stale_reply",
    }
    assert rejected["oversize"] == counts["oversize"]
    assert rejected["stale_reply"] == counts["stray_reply"]
    assert rejected["bad_msgpack"] >= counts["huge_declared"] + counts["truncated"]
    assert rejected["invalid_message"] >= counts["invalid_body"]
    assert rejected["bad_frames"] + rejected["unexpected_hmac"] == counts["multipart"]
    assert listener.drain() == []
    assert_answers_handshake(listener, channels)

    for _ in range(50):  # raw TCP garbage; libzmq may parse some of it as legacy ZMTP frames
        with socket.create_connection((HOST, listener.address.port), timeout=5) as raw:
            raw.sendall(rng.randbytes(rng.randint(1, 512)))
    assert_answers_handshake(listener, channels)
    assert listener.listener_alive
    assert "listener_error" not in listener.rejected
    assert listener.drain() == []


@pytest.mark.integration
def test_authenticated_listener_rejects_forgeries(
    channels: list[ZmqControlChannel[Message]],
    dealers: Dealers,
) -> None:
    listener: ZmqControlChannel[Message] = ZmqControlChannel(
        CODEC, HOST, 0, secret=SECRET, max_frame_bytes=MAX_FRAME
    )
    channels.append(listener)
    listener.serve(responder(listener.address))
    sock = dealers(listener.address)
    rng = random.Random(7)
    valid = packed(envelope("m", VALID_BODIES[0]))
    expected = {"missing_hmac": 0, "bad_hmac": 0, "bad_frames": 0, "bad_msgpack": 0}
    for _ in range(1200):
        roll = rng.random()
        if roll < 0.2:
            sock.send(valid if rng.random() < 0.5 else rng.randbytes(40))
            expected["missing_hmac"] += 1
        elif roll < 0.4:
            sock.send_multipart([valid, rng.randbytes(rng.choice([0, 16, 32, 33]))])
            expected["bad_hmac"] += 1
        elif roll < 0.6:
            sock.send_multipart([valid, framing.sign(b"x" * 32, valid)])
            expected["bad_hmac"] += 1
        elif roll < 0.8:
            sock.send_multipart([valid, framing.sign(SECRET, valid), b""])
            expected["bad_frames"] += 1
        else:  # authentic but truncated: the tag passes, decoding still refuses it
            cut = valid[: rng.randrange(len(valid))]
            sock.send_multipart([cut, framing.sign(SECRET, cut)])
            expected["bad_msgpack"] += 1
    wait_for_total(listener, 1200)
    assert dict(listener.rejected) == {k: v for k, v in expected.items() if v}
    assert listener.drain() == []
    assert listener.listener_alive
    assert_answers_handshake(listener, channels, secret=SECRET)


@pytest.mark.integration
def test_frame_beyond_transport_cap_disconnects_sender_only(
    channels: list[ZmqControlChannel[Message]],
    dealers: Dealers,
) -> None:
    listener: ZmqControlChannel[Message] = ZmqControlChannel(
        CODEC, HOST, 0, max_frame_bytes=MAX_FRAME
    )
    channels.append(listener)
    listener.serve(responder(listener.address))
    giant = dealers(listener.address)
    giant.send(b"\x00" * (4 * MAX_FRAME))
    assert_answers_handshake(listener, channels)
    assert listener.listener_alive
    assert listener.rejected == {}


LIMITS = FrameLimits(max_frame_bytes=MAX_FRAME)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
envelopes = st.fixed_dictionaries(
    {},
    optional={
        "v": st.just(framing.WIRE_VERSION) | values,
        "k": st.sampled_from("mqre") | values,
        "c": st.integers(min_value=0, max_value=2**63 - 1) | values,
        "f": st.just([HOST, 1]) | values,
        "n": st.just(b"n" * framing.NONCE_BYTES) | values,
        "t": st.just(1.0) | values,
        "b": st.sampled_from(VALID_BODIES) | values,
    },
)


def decode_or_reason(payload: bytes) -> framing.Envelope | str:
    """The decoded envelope, or the reason it was rejected."""
    try:
        return framing.decode([payload], None, LIMITS)
    except FrameRejectedError as exc:
        return exc.reason.value


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.binary(max_size=600))
def test_random_bytes_decode_or_are_rejected_cleanly(payload: bytes) -> None:
    result = decode_or_reason(payload)
    if isinstance(result, str):
        assert result in {"bad_msgpack", "bad_envelope"}
    else:
        assert isinstance(result.kind, Kind)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=envelopes, data=st.data())
def test_random_envelopes_and_their_prefixes_never_escape_validation(
    env: dict[str, object], data: st.DataObject
) -> None:
    payload = packed(env)
    result = decode_or_reason(payload)
    if isinstance(result, str):
        assert result in {"bad_envelope", "oversize"}
    else:
        with contextlib.suppress(MalformedMessageError):  # anything else escapes and fails
            CODEC.decode(result.body)
    cut = data.draw(st.integers(min_value=0, max_value=len(payload) - 1))
    with pytest.raises(FrameRejectedError, match="bad_msgpack"):
        framing.decode([payload[:cut]], None, LIMITS)
