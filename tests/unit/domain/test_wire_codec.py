import math
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moriio.domain.params.transfer_params import MAX_INSTANCE_ID_LEN
from moriio.domain.protocol.codec import MESSAGE_TYPES, WIRE_CODEC, reject_reasons
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    MAX_BLOCK_ID,
    MAX_BLOCK_IDS,
    MAX_PROBE_CLAIMS,
    MAX_SPAN_OFFSET,
    MAX_SPANS,
    MAX_STR_LEN,
    MAX_TP_SIZE,
    PROTOCOL_VERSION,
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
    Probe,
    ProbeReply,
    Release,
    RemoteBlocks,
    WriteDone,
    WriteFailed,
)
from moriio.domain.values.modes import TransferMode
from moriio.ports import MalformedMessageError, MessageCodec, PeerAddress
from moriio.testing.handoffs import PROMPT

_codec: MessageCodec[Message] = WIRE_CODEC  # structural conformance, checked by mypy

ids = st.text(min_size=1, max_size=64)
ports = st.integers(min_value=1, max_value=65535)
_LABEL = r"[a-z]([a-z0-9-]{0,20}[a-z0-9])?"
hosts = st.from_regex(rf"\A{_LABEL}(\.{_LABEL})*\Z") | st.ip_addresses().map(str)
addresses = st.builds(PeerAddress, host=hosts, port=ports)


def _fingerprints(tp_size: int) -> Any:
    return st.builds(
        Fingerprint,
        model_name=ids,
        dtype=st.sampled_from(["bfloat16", "float16", "fp8_e4m3"]),
        block_size=st.integers(min_value=1, max_value=1024),
        layout_kinds=st.lists(st.sampled_from(["separated", "interleaved", "mla"]), min_size=1).map(
            tuple
        ),
        tp_size=st.just(tp_size),
        transfer_mode=st.sampled_from(TransferMode),
        total_num_kv_heads=st.integers(min_value=1, max_value=128),
        is_mla=st.booleans(),
    )


fingerprints = _fingerprints(8)


def _layers(num_spans: int) -> Any:
    """Layers of a handshake carrying ``num_spans`` spans (each in one of them, or none)."""
    return st.builds(
        LayerRegions,
        name=ids,
        descriptors=st.lists(st.binary(max_size=32), min_size=1, max_size=3).map(tuple),
        num_blocks=st.integers(min_value=1, max_value=MAX_BLOCK_ID),
        block_len=st.integers(min_value=1, max_value=1 << 30),
        span=st.integers(min_value=-1, max_value=num_spans - 1),
        span_offset=st.integers(min_value=0, max_value=MAX_SPAN_OFFSET),
        # per KV-cache group: a rank's slice layout (7 ints per plane), or none (whole pages)
        slices=st.sampled_from(
            [(), ((),), ((2, 0, 1024, 64, 16, 64, 4),), ((), (1, 8, 8, 8, 1, 8, 2))]
        ),
    )


tokens = st.binary(min_size=16, max_size=16).map(bytes.hex)
# Valid (rank, size) pairs of a TP group: every rank, not only rank 0, round-trips.
ranks_and_sizes = st.integers(1, MAX_TP_SIZE).flatmap(
    lambda size: st.tuples(st.integers(0, size - 1), st.just(size))
)


def _handshake(cls: type[HandshakeRequest] | type[HandshakeReply]) -> Any:
    return ranks_and_sizes.flatmap(lambda pair: _handshake_of(cls, *pair))


def _handshake_of(
    cls: type[HandshakeRequest] | type[HandshakeReply], tp_rank: int, tp_size: int
) -> Any:
    return st.lists(st.binary(max_size=32), max_size=3).flatmap(
        lambda spans: st.builds(
            cls,
            fingerprint=_fingerprints(tp_size),
            engine_metadata=st.binary(max_size=64),
            layers=st.lists(
                _layers(len(spans)), max_size=4, unique_by=lambda layer: layer.name
            ).map(tuple),
            control=addresses,
            dp_rank=st.integers(min_value=0, max_value=7),
            tp_rank=st.just(tp_rank),
            instance_id=ids,
            spans=st.just(tuple(spans)),
        )
    )


def _remote_blocks(rank: int, size: int) -> Any:
    return st.builds(
        RemoteBlocks,
        transfer_id=ids,
        request_id=ids,
        block_ids=st.lists(st.integers(min_value=0, max_value=MAX_BLOCK_ID), max_size=64).map(
            tuple
        ),
        first_block=st.integers(min_value=0, max_value=1 << 20),
        consumer_dp_rank=st.integers(min_value=0, max_value=1000),
        consumer_tp_rank=st.just(rank),
        consumer_tp_size=st.just(size),
        reply_to=addresses,
        consumer_instance_id=ids,
        write_by=st.floats(min_value=0.0, max_value=4102444800.0),
        token=tokens,
    )


messages = st.one_of(
    ranks_and_sizes.flatmap(lambda pair: _remote_blocks(*pair)),
    st.builds(WriteDone, transfer_id=ids, token=tokens | st.just("")),
    st.builds(WriteFailed, transfer_id=ids, reason=st.text(max_size=100), token=tokens),
    ranks_and_sizes.flatmap(
        lambda pair: st.builds(
            Release,
            transfer_id=ids,
            consumer_tp_rank=st.just(pair[0]),
            consumer_tp_size=st.just(pair[1]),
        )
    ),
    _handshake(HandshakeRequest),
    _handshake(HandshakeReply),
    st.builds(HandshakeRejected, reason=st.text(max_size=100)),
    st.builds(
        Probe,
        instance_id=ids,
        control=addresses,
        claims=st.lists(st.tuples(ids, tokens), max_size=8).map(tuple),
    ),
    st.builds(ProbeReply, instance_id=ids),
)


@settings(max_examples=200)
@given(messages)
def test_every_message_round_trips_through_msgpack(message: Message) -> None:
    wire = WIRE_CODEC.encode(message)
    assert wire["type"] in MESSAGE_TYPES
    assert wire["v"] == PROTOCOL_VERSION
    raw = msgpack.unpackb(msgpack.packb(wire), raw=False)
    assert WIRE_CODEC.decode(raw) == message


TOKEN = "0123456789abcdef" * 2


def _valid(kind: str) -> dict[str, Any]:
    fp = Fingerprint(
        model_name="m",
        dtype="bfloat16",
        block_size=16,
        layout_kinds=("separated", "separated"),
        tp_size=2,
        transfer_mode=TransferMode.READ,
        total_num_kv_heads=8,
        is_mla=False,
    )
    layer = LayerRegions("l0", (b"d",), num_blocks=4, block_len=64, span=0, span_offset=96)
    examples: dict[str, Message] = {
        "remote_blocks": RemoteBlocks(
            "t",
            "r",
            (1, 2),
            0,
            0,
            1,
            2,
            PeerAddress("10.0.0.1", 7000),
            "consumer-1",
            1.5e9,
            TOKEN,
            prompt=PROMPT,
        ),
        "release": Release("t", 8, 3, "cafe"),
        "handshake_request": HandshakeRequest(
            fp, b"meta", (layer,), PeerAddress("10.0.0.1", 7000), 0, 1, "producer-1", spans=(b"s",)
        ),
        "probe": Probe("consumer-1", PeerAddress("10.0.0.1", 7000), (("t", TOKEN),)),
    }
    return dict(WIRE_CODEC.encode(examples[kind]))


def _reason(raw: object) -> str:
    with pytest.raises(MalformedMessageError) as exc:
        WIRE_CODEC.decode(raw)
    return exc.value.reason


@pytest.mark.parametrize("raw", ["t1", b"t1", None, 3, ["release"]])
def test_non_mappings_are_rejected(raw: object) -> None:
    assert _reason(raw) == "not_a_mapping"


def test_other_protocol_versions_are_rejected() -> None:
    assert _reason({**_valid("release"), "v": PROTOCOL_VERSION + 1}) == "unsupported_version"
    assert _reason({**_valid("release"), "v": 1}) == "unsupported_version"  # no capabilities
    assert _reason({**_valid("release"), "v": "1"}) == "bad_type"


def test_unknown_types_are_rejected() -> None:
    assert _reason({**_valid("release"), "type": "bogus"}) == "unknown_type"
    assert _reason({**_valid("release"), "type": 1}) == "bad_type"


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("release", "transfer_id"),
        ("release", "consumer_tp_size"),
        ("release", "type"),
        ("release", "v"),
        ("remote_blocks", "block_ids"),
        ("remote_blocks", "reply_port"),
        ("remote_blocks", "consumer_instance_id"),
        ("handshake_request", "fingerprint"),
        ("handshake_request", "instance_id"),
    ],
)
def test_missing_fields_are_rejected(kind: str, key: str) -> None:
    raw = _valid(kind)
    del raw[key]
    with pytest.raises(MalformedMessageError, match=key) as exc:
        WIRE_CODEC.decode(raw)
    assert exc.value.reason == "missing_field"


def test_missing_nested_fields_are_rejected() -> None:
    raw = _valid("handshake_request")
    del raw["fingerprint"]["dtype"]
    assert _reason(raw) == "missing_field"


def test_unknown_fields_are_rejected_at_every_level() -> None:
    assert _reason({**_valid("release"), "extra": 1}) == "unknown_field"
    raw = _valid("handshake_request")
    raw["layers"][0]["extra"] = 1
    assert _reason(raw) == "unknown_field"


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("release", "transfer_id", b"t"),
        ("release", "consumer_tp_size", True),
        ("release", "consumer_tp_size", 2.0),
        ("remote_blocks", "block_ids", "1,2"),
        ("remote_blocks", "block_ids", [1, True]),
        ("remote_blocks", "block_ids", [1, 2.0]),
        ("remote_blocks", "reply_host", None),
        ("handshake_request", "engine_metadata", "meta"),
        ("handshake_request", "fingerprint", ["m"]),
        ("handshake_request", "layers", {"l0": 1}),
        ("handshake_request", "instance_id", 7),
        ("remote_blocks", "consumer_instance_id", b"c"),
    ],
)
def test_mistyped_fields_are_rejected(kind: str, key: str, value: object) -> None:
    raw = _valid(kind)
    raw[key] = value
    with pytest.raises(MalformedMessageError, match=key) as exc:
        WIRE_CODEC.decode(raw)
    assert exc.value.reason == "bad_type"


def test_mistyped_nested_values_are_rejected() -> None:
    raw = _valid("handshake_request")
    raw["layers"][0]["descriptors"] = ["not bytes"]
    assert _reason(raw) == "bad_type"
    raw = _valid("handshake_request")
    raw["fingerprint"]["is_mla"] = 0
    assert _reason(raw) == "bad_type"


@pytest.mark.parametrize(
    ("kind", "key", "value"),
    [
        ("release", "consumer_tp_size", 0),
        ("release", "consumer_tp_size", MAX_TP_SIZE + 1),
        ("release", "transfer_id", "x" * (MAX_STR_LEN + 1)),
        ("remote_blocks", "block_ids", [0, -1]),
        ("remote_blocks", "block_ids", [MAX_BLOCK_ID + 1]),
        ("remote_blocks", "consumer_dp_rank", -1),
        ("remote_blocks", "reply_port", 0),
        ("remote_blocks", "reply_port", 65536),
        ("handshake_request", "dp_rank", 1 << 40),
        ("handshake_request", "instance_id", "i" * (MAX_INSTANCE_ID_LEN + 1)),
        ("remote_blocks", "consumer_instance_id", "i" * (MAX_INSTANCE_ID_LEN + 1)),
    ],
)
def test_out_of_range_values_are_rejected(kind: str, key: str, value: object) -> None:
    raw = _valid(kind)
    raw[key] = value
    with pytest.raises(MalformedMessageError, match=key) as exc:
        WIRE_CODEC.decode(raw)
    assert exc.value.reason == "out_of_range"


def test_too_many_block_ids_are_rejected() -> None:
    raw = _valid("remote_blocks")
    raw["block_ids"] = [0] * (MAX_BLOCK_IDS + 1)
    assert _reason(raw) == "out_of_range"


def test_out_of_range_nested_values_are_rejected() -> None:
    raw = _valid("handshake_request")
    raw["layers"][0]["num_blocks"] = 0
    assert _reason(raw) == "out_of_range"
    raw = _valid("handshake_request")
    raw["fingerprint"]["tp_size"] = 4096
    assert _reason(raw) == "out_of_range"


def test_invalid_values_are_rejected() -> None:
    assert _reason({**_valid("release"), "transfer_id": ""}) == "invalid_value"
    assert _reason({**_valid("remote_blocks"), "consumer_tp_rank": 2}) == "invalid_value"
    raw = _valid("handshake_request")
    raw["layers"] = [raw["layers"][0], dict(raw["layers"][0])]
    assert _reason(raw) == "invalid_value"
    raw = _valid("handshake_request")
    raw["fingerprint"]["transfer_mode"] = "push"
    assert _reason(raw) == "invalid_value"
    assert _reason({**_valid("handshake_request"), "tp_rank": 2}) == "invalid_value"
    assert _reason({**_valid("handshake_request"), "instance_id": ""}) == "invalid_value"
    assert _reason({**_valid("remote_blocks"), "consumer_instance_id": ""}) == "invalid_value"


def test_a_layer_names_only_a_span_the_handshake_carries() -> None:
    message = WIRE_CODEC.decode(_valid("handshake_request"))
    assert isinstance(message, HandshakeRequest)
    assert message.spans == (b"s",)
    assert (message.layers[0].span, message.layers[0].span_offset) == (0, 96)
    raw = _valid("handshake_request")
    raw["layers"][0]["span"] = 1  # past the one span carried
    assert _reason(raw) == "invalid_value"
    raw = _valid("handshake_request")
    raw["spans"] = []
    assert _reason(raw) == "invalid_value"
    for span, offset in ((-2, 0), (MAX_SPANS, 0), (0, -1), (0, MAX_SPAN_OFFSET + 1)):
        raw = _valid("handshake_request")
        raw["layers"][0].update(span=span, span_offset=offset)
        assert _reason(raw) == "out_of_range", (span, offset)
    raw = _valid("handshake_request")
    raw["spans"] = [b"s"] * (MAX_SPANS + 1)
    assert _reason(raw) == "out_of_range"


def test_a_probe_pairs_each_claimed_transfer_with_its_capability() -> None:
    assert _reason({**_valid("probe"), "tokens": []}) == "invalid_value"
    assert _reason({**_valid("probe"), "tokens": ["cafe"]}) == "invalid_value"
    assert _reason({**_valid("probe"), "transfer_ids": [""]}) == "out_of_range"
    assert _reason({**_valid("probe"), "control_host": "not a host!"}) == "invalid_value"
    too_many = {**_valid("probe"), "transfer_ids": ["t"] * (MAX_PROBE_CLAIMS + 1)}
    assert _reason(too_many) == "out_of_range"


def test_instance_ids_travel_in_handshakes_and_remote_blocks() -> None:
    handshake = WIRE_CODEC.decode(_valid("handshake_request"))
    assert isinstance(handshake, HandshakeRequest)
    assert handshake.instance_id == "producer-1"
    blocks = WIRE_CODEC.decode(_valid("remote_blocks"))
    assert isinstance(blocks, RemoteBlocks)
    assert blocks.consumer_instance_id == "consumer-1"
    longest = {**_valid("handshake_request"), "instance_id": "i" * MAX_INSTANCE_ID_LEN}
    assert WIRE_CODEC.decode(longest) == replace(handshake, instance_id="i" * MAX_INSTANCE_ID_LEN)


def test_empty_block_list_is_a_valid_free_only_message() -> None:
    raw = {**_valid("remote_blocks"), "block_ids": []}
    message = WIRE_CODEC.decode(raw)
    assert isinstance(message, RemoteBlocks)
    assert message.block_ids == ()


def test_reason_codes_are_stable() -> None:
    assert set(reject_reasons()) == {
        "not_a_mapping",
        "unsupported_version",
        "unknown_type",
        "missing_field",
        "unknown_field",
        "bad_type",
        "out_of_range",
        "invalid_value",
    }


def test_encode_refuses_non_messages() -> None:
    with pytest.raises(TypeError, match="not a moriio message"):
        WIRE_CODEC.encode("release")  # type: ignore[arg-type]


wire_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.integers(), inner, max_size=5)
    ),
    max_leaves=20,
)


@settings(max_examples=300)
@given(
    kind=st.sampled_from(["remote_blocks", "release", "handshake_request"]),
    key=st.text(max_size=20),
    value=wire_values,
)
def test_corrupted_messages_only_ever_raise_malformed_message(
    kind: str, key: str, value: object
) -> None:
    raw = _valid(kind)
    target = raw["fingerprint"] if kind == "handshake_request" and len(key) % 2 else raw
    target[key] = value
    try:
        decoded = WIRE_CODEC.decode(raw)
    except MalformedMessageError as exc:
        reason = exc.reason
        assert reason in reject_reasons()
    else:
        assert WIRE_CODEC.encode(decoded) == raw


@settings(max_examples=300)
@given(wire_values)
def test_arbitrary_values_only_ever_raise_malformed_message(raw: object) -> None:
    try:
        decoded = WIRE_CODEC.decode(raw)
    except MalformedMessageError as exc:
        reason = exc.reason
        assert reason in reject_reasons()
    else:  # vanishingly rare: a random value that is a valid message
        assert WIRE_CODEC.encode(decoded) == raw


@pytest.mark.parametrize(
    ("kind", "key", "value", "reason"),
    [
        ("remote_blocks", "reply_host", "127.0.0.1 ", "invalid_value"),
        ("remote_blocks", "reply_host", "127.0.0.1\n", "invalid_value"),
        ("remote_blocks", "reply_host", "Host.Example", "invalid_value"),
        ("handshake_request", "control_host", "a b", "invalid_value"),
        ("release", "consumer_tp_rank", 8, "invalid_value"),
        ("release", "transfer_id", "t" * 100_000, "out_of_range"),
        ("release", "token", "x" * 1000, "out_of_range"),
    ],
)
def test_hostile_values_are_rejected_at_decode(
    kind: str, key: str, value: object, reason: str
) -> None:
    raw = _valid(kind)
    raw[key] = value
    assert _reason(raw) == reason


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (math.inf, "out_of_range"),
        (math.nan, "out_of_range"),
        (-1.0, "out_of_range"),
        (5e9, "out_of_range"),
        ("soon", "bad_type"),
        (None, "bad_type"),
    ],
)
def test_absurd_write_by_leases_are_rejected(value: object, reason: str) -> None:
    raw = _valid("remote_blocks")
    raw["write_by"] = value
    assert _reason(raw) == reason


def test_the_write_by_lease_round_trips() -> None:
    raw = _valid("remote_blocks")
    message = WIRE_CODEC.decode(raw)
    assert isinstance(message, RemoteBlocks)
    assert message.write_by == 1.5e9
    raw["write_by"] = 1_700_000_000  # an int is a valid number of seconds
    decoded = WIRE_CODEC.decode(raw)
    assert isinstance(decoded, RemoteBlocks)
    assert decoded.write_by == 1.7e9


@pytest.mark.parametrize(
    ("kind", "token", "reason"),
    [
        ("remote_blocks", "", "invalid_value"),  # an announcement must mint a capability
        ("remote_blocks", "ABCDEF" * 5 + "AB", "invalid_value"),
        ("remote_blocks", "0" * 31, "invalid_value"),
        ("remote_blocks", 7, "bad_type"),
        ("write_done", "g" * 32, "invalid_value"),
        ("write_failed", "0" * 33, "invalid_value"),
    ],
)
def test_capabilities_are_spelled_as_minted(kind: str, token: object, reason: str) -> None:
    raw = _valid("remote_blocks")
    if kind != "remote_blocks":
        raw = {"type": kind, "v": PROTOCOL_VERSION, "transfer_id": "t", "reason": "x"}
        if kind == "write_done":
            del raw["reason"]
    assert _reason({**raw, "token": token}) == reason


def test_a_verdict_without_its_token_field_is_refused() -> None:
    raw = dict(WIRE_CODEC.encode(WriteDone("t", TOKEN)))
    del raw["token"]
    assert _reason(raw) == "missing_field"


@pytest.mark.parametrize(
    ("slices", "match"),
    [
        ("x", "slices: expected list"),
        (["x"], "expected a list of at most"),
        ([[1, -2, 3]], "entries must be ints"),
        ([["1"]], "entries must be ints"),
        ([[1, 2, 3]], "7 ints per plane"),
        ([[9, 0, 64, 64, 1, 64, 4]], "holds 9 of 4 units"),
    ],
)
def test_hostile_slice_layouts_in_a_handshake_are_rejected(slices: object, match: str) -> None:
    raw = _valid("handshake_request")
    raw["layers"][0]["slices"] = slices
    with pytest.raises(MalformedMessageError, match=match):
        WIRE_CODEC.decode(raw)
