"""Fuzz the wire decoder: whatever arrives, it returns a message or a counted rejection.

Three sources of hostile input: arbitrary msgpack-able structures, valid messages mutated at
a random place (missing, unknown and mistyped fields, out-of-range numbers, huge arrays,
wrong versions and types), and raw bytes (random or truncated msgpack) unpacked as the
control channel unpacks a frame. Any exception other than ``MalformedMessageError`` is a
crash; rejections are counted by reason. The fuzz is derandomized (the same examples on
every run), and every reason has a fixed witness, so no assertion rests on a random draw.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moriio.adapters.zmq.framing import FrameLimits, FrameRejectedError, unpack
from moriio.domain.protocol.codec import WIRE_CODEC, reject_reasons
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    MAX_BLOCK_IDS,
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
    Release,
    RemoteBlocks,
    WriteDone,
    WriteFailed,
)
from moriio.domain.values.modes import TransferMode
from moriio.ports import MalformedMessageError, PeerAddress

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

ids = st.text(min_size=1, max_size=12)
small = st.integers(min_value=0, max_value=1000)
address = st.builds(PeerAddress, st.sampled_from(["10.0.0.1", "host-a"]), st.integers(1, 65535))
fingerprint = st.builds(
    Fingerprint,
    model_name=ids,
    dtype=st.sampled_from(["bfloat16", "float16"]),
    block_size=st.integers(1, 64),
    layout_kinds=st.lists(st.sampled_from(["separated", "mla"]), min_size=1, max_size=3).map(tuple),
    tp_size=st.just(4),
    transfer_mode=st.sampled_from(TransferMode),
    total_num_kv_heads=st.integers(1, 16),
    is_mla=st.booleans(),
)
layers = st.lists(
    st.builds(
        LayerRegions,
        name=ids,
        descriptors=st.lists(st.binary(max_size=8), min_size=1, max_size=2).map(tuple),
        num_blocks=st.integers(1, 100),
        block_len=st.integers(1, 4096),
    ),
    max_size=3,
    unique_by=lambda layer: layer.name,
).map(tuple)


def handshake(kind: type[HandshakeRequest] | type[HandshakeReply]) -> st.SearchStrategy[Message]:
    return st.builds(
        kind,
        fingerprint=fingerprint,
        engine_metadata=st.binary(max_size=16),
        layers=layers,
        control=address,
        dp_rank=small,
        tp_rank=st.integers(0, 3),
        instance_id=ids,
    )


def remote_blocks(rank: int, size: int) -> st.SearchStrategy[Message]:
    """A consumer rank's announcement: any valid rank of its TP group, not only rank 0."""
    return st.builds(
        RemoteBlocks,
        transfer_id=ids,
        request_id=ids,
        block_ids=st.lists(small, max_size=6).map(tuple),
        first_block=small,
        consumer_dp_rank=small,
        consumer_tp_rank=st.just(rank),
        consumer_tp_size=st.just(size),
        reply_to=address,
        consumer_instance_id=ids,
        write_by=st.floats(0.0, 4102444800.0),
        token=st.binary(min_size=16, max_size=16).map(bytes.hex),
    )


valid_messages: st.SearchStrategy[Message] = st.one_of(
    st.integers(1, 8).flatmap(
        lambda size: st.integers(0, size - 1).flatmap(lambda rank: remote_blocks(rank, size))
    ),
    st.builds(WriteDone, transfer_id=ids, token=st.just("ab" * 16)),
    st.builds(WriteFailed, transfer_id=ids, reason=st.text(max_size=8), token=st.just("")),
    st.builds(Release, transfer_id=ids, consumer_tp_size=st.integers(1, 8)),
    handshake(HandshakeRequest),
    handshake(HandshakeReply),
    st.builds(HandshakeRejected, reason=st.text(max_size=8)),
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=20),
    st.binary(max_size=20),
)
wire_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(
            st.one_of(st.text(max_size=12), st.integers(-(2**63), 2**63 - 1)), children, max_size=5
        ),
    ),
    max_leaves=25,
)
# Values that are of a wrong type or out of range almost anywhere in a message.
hostile = st.one_of(
    scalars,
    st.just(""),
    st.just(-1),
    st.just(2**62),
    st.just("x" * 5000),
    st.builds(lambda: [0] * (MAX_BLOCK_IDS + 1)),  # one entry too many
    st.builds(lambda: ["layer"] * 3),
    st.builds(lambda: {"unexpected": 1}),
    st.builds(
        lambda: [{"name": "dup", "descriptors": [b"d"], "num_blocks": 1, "block_len": 1}] * 2
    ),
    st.lists(small, max_size=3),
)

Counts = Counter[str]


def check(raw: object, counts: Counts) -> None:
    """Decode ``raw``: a valid message, or a MalformedMessageError with a known reason."""
    try:
        message = WIRE_CODEC.decode(raw)
    except MalformedMessageError as exc:
        reason = exc.reason
    else:
        counts["accepted"] += 1
        # What was accepted must encode back to something the decoder accepts again.
        assert WIRE_CODEC.decode(_wire(WIRE_CODEC.encode(message))) == message
        return
    assert reason in reject_reasons(), reason
    counts[reason] += 1


def _wire(value: object) -> Any:
    return msgpack.unpackb(msgpack.packb(value, use_bin_type=True), raw=False)


def _slots(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every path to a value inside nested dicts and lists (the root is ``()``)."""
    found = [path]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _slots(child, (*path, key))
    elif isinstance(value, list) and len(value) <= 16:
        for index, child in enumerate(value):
            found += _slots(child, (*path, index))
    return found


def _parent(root: Any, path: tuple[object, ...]) -> Any:
    for step in path[:-1]:
        root = root[step]
    return root


def _stretched(value: object) -> object:
    """``value``'s type, but out of range or empty: what limits and emptiness checks catch."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return -1 if value > 0 else 2**62
    if isinstance(value, str):
        return "" if value else "x" * 5000
    if isinstance(value, bytes):
        return b"\0" * (1 << 17)
    if isinstance(value, list):
        return [] if value else [0] * (MAX_BLOCK_IDS + 1)
    return {}


@st.composite
def mutated(draw: st.DrawFn) -> object:
    """A valid message's wire form with one to three random defects."""
    raw: Any = copy.deepcopy(_wire(WIRE_CODEC.encode(draw(valid_messages))))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _slots(raw) if p]
        if not paths:
            return draw(hostile)
        path = draw(st.sampled_from(paths))
        parent, key = _parent(raw, path), path[-1]
        action = draw(
            st.sampled_from(["drop", "replace", "stretch", "add", "retype", "version", "whole"])
        )
        if action == "drop":
            del parent[key]
        elif action == "replace":
            parent[key] = draw(hostile)
        elif action == "stretch":  # same type, beyond its limits
            parent[key] = _stretched(parent[key])
        elif action == "whole":
            return draw(st.one_of(scalars, st.lists(scalars, max_size=3)))
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(scalars)
        elif action == "retype":
            raw["type"] = draw(st.one_of(st.text(max_size=10), scalars))
        else:
            raw["v"] = draw(st.one_of(st.integers(-3, 5), scalars))
    return raw


def run_fuzz(strategy: st.SearchStrategy[Any], feed: Callable[[Any, Counts], None]) -> Counts:
    counts: Counts = Counter()

    @FUZZ
    @given(strategy)
    def fuzz(value: Any) -> None:
        feed(value, counts)

    fuzz()
    return counts


def test_arbitrary_structures_never_crash_the_decoder() -> None:
    counts = run_fuzz(wire_values, check)
    assert sum(counts.values()) >= 300
    assert counts["not_a_mapping"] > 0
    assert counts["accepted"] == 0  # noise is never a message


def test_mutated_messages_are_rejected_for_known_reasons_or_still_valid() -> None:
    counts = run_fuzz(mutated(), check)
    assert sum(counts.values()) >= 300
    for reason in ("missing_field", "unknown_field", "bad_type", "out_of_range"):
        assert counts[reason] > 0, sorted(counts.items())


_RELEASE: dict[str, object] = WIRE_CODEC.encode(Release("t", 1, 0))
WITNESSES: dict[str, object] = {
    "not_a_mapping": [_RELEASE],
    "unsupported_version": _RELEASE | {"v": 99},
    "unknown_type": _RELEASE | {"type": "nope"},
    "missing_field": {k: v for k, v in _RELEASE.items() if k != "consumer_tp_size"},
    "unknown_field": _RELEASE | {"extra": 1},
    "bad_type": _RELEASE | {"consumer_tp_size": "1"},
    "out_of_range": _RELEASE | {"consumer_tp_size": 2**62},
    "invalid_value": _RELEASE | {"transfer_id": ""},
}


def test_every_reject_reason_has_a_witness() -> None:
    assert set(WITNESSES) == set(reject_reasons())


@pytest.mark.parametrize(("reason", "raw"), WITNESSES.items(), ids=list(WITNESSES))
def test_each_witness_is_rejected_for_its_reason(reason: str, raw: object) -> None:
    counts: Counts = Counter()
    check(raw, counts)
    assert counts == {reason: 1}


LIMITS = FrameLimits(max_frame_bytes=1 << 16)


def feed_bytes(data: bytes, counts: Counts) -> None:
    """Bytes unpacked as the control channel unpacks a frame, then decoded."""
    try:
        raw = unpack(data, LIMITS)
    except FrameRejectedError as exc:
        counts[exc.reason.value] += 1
        return
    check(raw, counts)


def truncated(message: Message, cut: float) -> bytes:
    packed: bytes = msgpack.packb(WIRE_CODEC.encode(message), use_bin_type=True)
    return packed[: int(len(packed) * cut)]


def test_random_and_truncated_bytes_never_crash_the_decoder() -> None:
    raw_bytes = st.one_of(
        st.binary(max_size=256),
        st.builds(truncated, valid_messages, st.floats(0.0, 0.99)),
        st.builds(
            lambda value: msgpack.packb(value, use_bin_type=True), wire_values
        ),  # well-formed msgpack of anything
    )
    counts = run_fuzz(raw_bytes, feed_bytes)
    assert counts["bad_msgpack"] > 0
    assert sum(counts.values()) >= 300


def test_huge_declared_sizes_are_refused_before_allocation() -> None:
    counts: Counts = Counter()
    for header in (b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff"):
        feed_bytes(header, counts)  # a 4-billion-entry array / map / string in 5 bytes
    feed_bytes(b"\x00" * (LIMITS.max_frame_bytes + 1), counts)
    assert counts == {"bad_msgpack": 3, "oversize": 1}


@given(valid_messages)
def test_every_valid_message_survives_the_frame_path(message: Message) -> None:
    packed = msgpack.packb(WIRE_CODEC.encode(message), use_bin_type=True)
    assert WIRE_CODEC.decode(unpack(packed, LIMITS)) == message
