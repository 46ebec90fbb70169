"""Registration generations and the V-layout fingerprint field on the wire and in params:
they round-trip, a peer may leave them out (read as their default), and a bad value is
rejected with a stable reason that names the field."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moriio.domain.params.transfer_params import (
    MAX_GENERATION,
    TransferParamsError,
    parse_transfer_params,
)
from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import Fingerprint
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    HandshakeReply,
    HandshakeRequest,
    RemoteBlocks,
    Retired,
    RetiredAck,
)
from moriio.domain.values.modes import TransferMode
from moriio.ports import MalformedMessageError, PeerAddress

TOKEN = "0123456789abcdef" * 2
CONTROL = PeerAddress("10.0.0.1", 7100)
FP = Fingerprint(
    "m", "bfloat16", 16, ("separated",), 1, TransferMode.READ, 8, False,
    vllm_version="0.33.0", value_layout="shuffle=off;v=standard",
)  # fmt: skip
LAYER = LayerRegions(name="l0", descriptors=(b"d",), num_blocks=4, block_len=64)


def _roundtrip(message: Any) -> Any:
    return WIRE_CODEC.decode(msgpack.unpackb(msgpack.packb(WIRE_CODEC.encode(message))))


def _reason(raw: dict[str, Any]) -> tuple[str, str]:
    with pytest.raises(MalformedMessageError) as exc:
        WIRE_CODEC.decode(raw)
    return exc.value.reason, str(exc.value)


@settings(max_examples=100)
@given(
    kind=st.sampled_from([Retired, RetiredAck]),
    instance=st.text(min_size=1, max_size=64),
    generation=st.integers(1, MAX_GENERATION),
)
def test_retirement_notices_round_trip(kind: type, instance: str, generation: int) -> None:
    message = kind(instance, generation, CONTROL)
    assert _roundtrip(message) == message


@pytest.mark.parametrize("cls", [HandshakeRequest, HandshakeReply])
def test_a_handshake_carries_its_generation_and_one_without_it_reads_as_the_first(
    cls: type[HandshakeRequest] | type[HandshakeReply],
) -> None:
    message = cls(FP, b"meta", (LAYER,), CONTROL, 0, 0, "p-1", 3)
    assert _roundtrip(message) == message
    raw = dict(WIRE_CODEC.encode(message))
    del raw["generation"]
    assert WIRE_CODEC.decode(raw).generation == 1  # type: ignore[union-attr]


def test_a_fingerprint_without_the_value_layout_reads_it_as_empty() -> None:
    raw = dict(WIRE_CODEC.encode(HandshakeRequest(FP, b"", (LAYER,), CONTROL, 0, 0, "p-1")))
    assert WIRE_CODEC.decode(raw).fingerprint.value_layout == "shuffle=off;v=standard"  # type: ignore[union-attr]
    fingerprint = dict(raw["fingerprint"])
    del fingerprint["value_layout"]
    raw["fingerprint"] = fingerprint
    assert WIRE_CODEC.decode(raw).fingerprint.value_layout == ""  # type: ignore[union-attr]
    fingerprint["value_layout"] = 7
    assert _reason(raw)[0] == "bad_type"


def test_an_announcement_names_the_consumer_generation_or_none() -> None:
    blocks = RemoteBlocks(
        "t", "r", (1, 2), 0, 0, 0, 1, CONTROL, "c-1", 1.5e9, TOKEN, consumer_generation=2
    )
    assert _roundtrip(blocks) == blocks
    raw = dict(WIRE_CODEC.encode(blocks))
    del raw["consumer_generation"]
    assert WIRE_CODEC.decode(raw).consumer_generation == 0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("value", "reason"),
    [(0, "out_of_range"), (-1, "out_of_range"), (MAX_GENERATION + 1, "out_of_range"),
     (True, "bad_type"), ("2", "bad_type"), (2.0, "bad_type")],
)  # fmt: skip
def test_a_bad_generation_is_refused_naming_the_field(value: object, reason: str) -> None:
    for message in (
        HandshakeRequest(FP, b"", (LAYER,), CONTROL, 0, 0, "p-1"),
        Retired("p-1", 1, CONTROL),
        RetiredAck("p-1", 1, CONTROL),
    ):
        raw = dict(WIRE_CODEC.encode(message))
        raw["generation"] = value
        got, text = _reason(raw)
        assert got == reason
        assert "generation" in text


def _params(**more: Any) -> dict[str, Any]:
    return {
        "transfer_id": "t",
        "do_remote_prefill": True,
        "remote_host": "10.0.0.1",
        "remote_handshake_port": 7000,
        "remote_notify_port": 7100,
        "remote_block_ids": [[1, 2]],
        "remote_instance_id": "p-1",
        **more,
    }


def test_params_name_the_registration_generation_of_their_blocks() -> None:
    parsed = parse_transfer_params(_params(remote_registration_generation=3), "r")
    assert parsed is not None
    assert parsed.peer is not None
    assert parsed.peer.generation == 3
    other = parse_transfer_params(_params(remote_registration_generation=4), "r")
    assert other is not None
    assert other.peer is not None
    assert other.peer.generation == 4  # not a cached endpoint of another generation
    absent = parse_transfer_params(_params(), "r")
    assert absent is not None
    assert absent.peer is not None
    assert absent.peer.generation is None


@pytest.mark.parametrize("value", [0, -3, True, "2", 2.5, MAX_GENERATION + 1])
def test_params_with_a_bad_generation_are_refused_naming_the_key(value: object) -> None:
    with pytest.raises(TransferParamsError, match="remote_registration_generation"):
        parse_transfer_params(_params(remote_registration_generation=value), "r")
