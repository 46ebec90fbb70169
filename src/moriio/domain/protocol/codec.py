"""Plain-value wire form of the messages (:mod:`moriio.domain.protocol.messages`), with a
strict validating decoder.

Every encoded message is a ``dict`` of msgpack-able values (str, int, bool, bytes, list,
dict) with a ``"type"`` name and the protocol version under ``"v"``. The decoder rejects,
with :class:`~moriio.ports.MalformedMessageError` and a stable ``reason`` code:

- ``not_a_mapping``: the value is not a dict;
- ``unsupported_version``: ``"v"`` is not :data:`~moriio.domain.protocol.messages.PROTOCOL_VERSION`;
- ``unknown_type``: an unknown ``"type"``;
- ``missing_field`` / ``unknown_field``: a field absent / not part of the type (unknown
  fields are rejected, not ignored: a protocol change bumps the version);
- ``bad_type``: a value of the wrong type (a bool is not an int; bytes are not str);
- ``out_of_range``: a number or size outside the limits in :mod:`~moriio.domain.protocol.messages`;
- ``invalid_value``: a well-typed value that makes no sense (empty id, rank >= size,
  duplicate layer names, unknown transfer mode).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from moriio.domain.params.handoff_tags import MAX_SCHEME_LEN, PromptBinding, is_scheme
from moriio.domain.params.transfer_params import (
    MAX_GENERATION,
    MAX_INSTANCE_ID_LEN,
    MAX_TRANSFER_ID_LEN,
)
from moriio.domain.protocol.fields import (
    FieldReader,
    RejectReason,
    host_field,
    invalid,
    reject,
    value_type,
)
from moriio.domain.protocol.handshake_codec import (
    decode_handshake,
    decode_retirement,
    encode_handshake,
    encode_retirement,
)
from moriio.domain.protocol.messages import (
    MAX_BLOCK_ID,
    MAX_BLOCK_IDS,
    MAX_DP_SIZE,
    MAX_HANDOFF_KEY_BYTES,
    MAX_PORT,
    MAX_PROBE_CLAIMS,
    MAX_PROMPT_BINDING_BYTES,
    MAX_PROMPT_TOKENS,
    MAX_TOKEN_LEN,
    MAX_TP_SIZE,
    MAX_WALL_TIME,
    PROTOCOL_VERSION,
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
    Probe,
    ProbeReply,
    Release,
    RemoteBlocks,
    Retired,
    RetiredAck,
    WriteDone,
    WriteFailed,
)
from moriio.domain.values.capability import is_token
from moriio.ports import PeerAddress

TYPE_KEY = "type"
VERSION_KEY = "v"


# -- encoders ----------------------------------------------------------------------------


def _encode_body(msg: Message) -> tuple[str, dict[str, object]]:
    match msg:
        case RemoteBlocks():
            return "remote_blocks", {
                "transfer_id": msg.transfer_id,
                "request_id": msg.request_id,
                "block_ids": list(msg.block_ids),
                "first_block": msg.first_block,
                "consumer_dp_rank": msg.consumer_dp_rank,
                "consumer_tp_rank": msg.consumer_tp_rank,
                "consumer_tp_size": msg.consumer_tp_size,
                "reply_host": msg.reply_to.host,
                "reply_port": msg.reply_to.port,
                "consumer_instance_id": msg.consumer_instance_id,
                "write_by": float(msg.write_by),
                "token": msg.token,
                "consumer_generation": msg.consumer_generation,
                **_encode_prompt(msg.prompt),
            }
        case WriteDone():
            return "write_done", {"transfer_id": msg.transfer_id, "token": msg.token}
        case WriteFailed():
            return "write_failed", {
                "transfer_id": msg.transfer_id,
                "reason": msg.reason,
                "token": msg.token,
            }
        case Release():
            return "release", {
                "transfer_id": msg.transfer_id,
                "consumer_tp_size": msg.consumer_tp_size,
                "consumer_tp_rank": msg.consumer_tp_rank,
                "token": msg.token,
            }
        case HandshakeRequest():
            return "handshake_request", encode_handshake(msg)
        case HandshakeReply():
            return "handshake_reply", {**encode_handshake(msg), "handoff_key": msg.handoff_key}
        case HandshakeRejected():
            return "handshake_rejected", {"reason": msg.reason}
        case Probe():
            return "probe", {
                "instance_id": msg.instance_id,
                "control_host": msg.control.host,
                "control_port": msg.control.port,
                "transfer_ids": [tid for tid, _ in msg.claims],
                "tokens": [token for _, token in msg.claims],
            }
        case ProbeReply():
            return "probe_reply", {"instance_id": msg.instance_id}
        case Retired() | RetiredAck():
            return encode_retirement(msg)
    raise TypeError(f"not a moriio message: {type(msg).__name__}")


def _encode_prompt(prompt: PromptBinding | None) -> dict[str, object]:
    if prompt is None:
        return {"prompt_scheme": "", "prompt_tokens": 0, "prompt_binding": b""}
    return {
        "prompt_scheme": prompt.scheme,
        "prompt_tokens": prompt.num_tokens,
        "prompt_binding": prompt.value,
    }


# -- decoders ----------------------------------------------------------------------------


def _transfer_id(f: FieldReader) -> str:
    return f.text("transfer_id", MAX_TRANSFER_ID_LEN)


def _token(f: FieldReader, *, required: bool) -> str:
    """A capability: 32 lowercase hex digits (or, where not ``required``, empty)."""
    token = f.text("token", MAX_TOKEN_LEN, allow_empty=True)
    if token == "" and not required:
        return token
    if not is_token(token):
        raise invalid("token", "must be 32 lowercase hex digits")
    return token


def _decode_release(f: FieldReader) -> Release:
    msg = Release(
        transfer_id=_transfer_id(f),
        consumer_tp_size=f.integer("consumer_tp_size", 1, MAX_TP_SIZE),
        consumer_tp_rank=f.integer("consumer_tp_rank", 0, MAX_TP_SIZE - 1),
        token=f.text("token", MAX_TOKEN_LEN, allow_empty=True),
    )
    if msg.consumer_tp_rank >= msg.consumer_tp_size:
        raise invalid("release", "consumer_tp_rank must be < consumer_tp_size")
    return msg


def _decode_remote_blocks(f: FieldReader) -> RemoteBlocks:
    msg = RemoteBlocks(
        transfer_id=_transfer_id(f),
        request_id=f.text("request_id"),
        block_ids=f.int_array("block_ids", MAX_BLOCK_IDS, 0, MAX_BLOCK_ID),
        first_block=f.integer("first_block", 0, MAX_BLOCK_IDS),
        consumer_dp_rank=f.integer("consumer_dp_rank", 0, MAX_DP_SIZE - 1),
        consumer_tp_rank=f.integer("consumer_tp_rank", 0, MAX_TP_SIZE - 1),
        consumer_tp_size=f.integer("consumer_tp_size", 1, MAX_TP_SIZE),
        reply_to=PeerAddress(host_field(f, "reply_host"), f.integer("reply_port", 1, MAX_PORT)),
        consumer_instance_id=f.text("consumer_instance_id", MAX_INSTANCE_ID_LEN),
        write_by=f.number("write_by", 0.0, MAX_WALL_TIME),
        token=_token(f, required=True),
        consumer_generation=f.optional_integer("consumer_generation", 0, MAX_GENERATION, 0),
        prompt=_prompt(f),
    )
    if msg.consumer_tp_rank >= msg.consumer_tp_size:
        raise invalid("remote_blocks", "consumer_tp_rank must be < consumer_tp_size")
    return msg


def _prompt(f: FieldReader) -> PromptBinding | None:
    """A prompt binding (None: the consumer has none, announced with an empty scheme)."""
    scheme = f.text("prompt_scheme", MAX_SCHEME_LEN, allow_empty=True)
    tokens = f.integer("prompt_tokens", 0, MAX_PROMPT_TOKENS)
    value = f.blob("prompt_binding", MAX_PROMPT_BINDING_BYTES)
    if not scheme:
        return None
    if not is_scheme(scheme):
        raise invalid("prompt_scheme", "must be 1..48 of a-z, 0-9, '_' and '-'")
    return PromptBinding(scheme, tokens, value)


def _decode_reply(f: FieldReader) -> HandshakeReply:
    reply = decode_handshake(f, HandshakeReply, "handshake_reply")
    assert isinstance(reply, HandshakeReply)
    key = f.blob("handoff_key", MAX_HANDOFF_KEY_BYTES)
    return dataclasses.replace(reply, handoff_key=key)


def _decode_probe(f: FieldReader) -> Probe:
    instance_id = f.text("instance_id", MAX_INSTANCE_ID_LEN)
    control = PeerAddress(host_field(f, "control_host"), f.integer("control_port", 1, MAX_PORT))
    ids = f.text_array("transfer_ids", MAX_PROBE_CLAIMS, MAX_TRANSFER_ID_LEN)
    tokens = f.text_array("tokens", MAX_PROBE_CLAIMS, MAX_TOKEN_LEN)
    if len(ids) != len(tokens) or not all(map(is_token, tokens)):
        raise invalid("probe", "each transfer id needs its capability (32 lowercase hex digits)")
    return Probe(instance_id, control, tuple(zip(ids, tokens, strict=True)))


_DECODERS: dict[str, Callable[[FieldReader], Message]] = {
    "remote_blocks": _decode_remote_blocks,
    "write_done": lambda f: WriteDone(transfer_id=_transfer_id(f), token=_token(f, required=False)),
    "write_failed": lambda f: WriteFailed(
        transfer_id=_transfer_id(f),
        reason=f.text("reason", allow_empty=True),
        token=_token(f, required=False),
    ),
    "release": _decode_release,
    "handshake_request": lambda f: decode_handshake(f, HandshakeRequest, "handshake_request"),
    "handshake_reply": _decode_reply,
    "handshake_rejected": lambda f: HandshakeRejected(reason=f.text("reason", allow_empty=True)),
    "probe": _decode_probe,
    "probe_reply": lambda f: ProbeReply(f.text("instance_id", MAX_INSTANCE_ID_LEN)),
    "retired": lambda f: decode_retirement(f, Retired),
    "retired_ack": lambda f: decode_retirement(f, RetiredAck),
}

MESSAGE_TYPES: frozenset[str] = frozenset(_DECODERS)
"""Every wire ``"type"`` name the codec knows."""


class WireCodec:
    """Encodes messages to plain dicts and decodes them back, validating strictly.

    Stateless and thread-safe. Satisfies ``moriio.ports.MessageCodec[Message]``.
    """

    def encode(self, message: Message) -> dict[str, object]:
        """Plain msgpack-able dict with ``"type"`` and ``"v"`` keys."""
        type_name, body = _encode_body(message)
        return {TYPE_KEY: type_name, VERSION_KEY: PROTOCOL_VERSION, **body}

    def decode(self, raw: object) -> Message:
        """Validate ``raw`` and build its message; raise ``MalformedMessageError`` otherwise."""
        if not isinstance(raw, dict):
            raise reject(RejectReason.NOT_A_MAPPING, f"got {value_type(raw)}")
        if VERSION_KEY not in raw:
            raise reject(RejectReason.MISSING_FIELD, VERSION_KEY)
        version = raw[VERSION_KEY]
        if type(version) is not int:
            raise reject(RejectReason.BAD_TYPE, f"{VERSION_KEY}: got {value_type(version)}")
        if version != PROTOCOL_VERSION:
            raise reject(
                RejectReason.UNSUPPORTED_VERSION,
                f"version {version}, this peer speaks {PROTOCOL_VERSION}",
            )
        if TYPE_KEY not in raw:
            raise reject(RejectReason.MISSING_FIELD, TYPE_KEY)
        type_name = raw[TYPE_KEY]
        if type(type_name) is not str:
            raise reject(RejectReason.BAD_TYPE, f"{TYPE_KEY}: got {value_type(type_name)}")
        decoder = _DECODERS.get(type_name)
        if decoder is None:
            raise reject(RejectReason.UNKNOWN_TYPE, repr(type_name[:40]))
        fields = FieldReader(raw, type_name)
        fields.mark_seen(TYPE_KEY, VERSION_KEY)
        message = decoder(fields)
        fields.finish()
        return message


WIRE_CODEC = WireCodec()
"""The shared stateless codec instance."""


def reject_reasons() -> tuple[str, ...]:
    """Every reason code the decoder may report (for pre-registering counters)."""
    return tuple(r.value for r in RejectReason)
