"""Plain-value wire form of :mod:`moriio.domain.wire.messages`, with a strict validating decoder.

Every encoded message is a ``dict`` of msgpack-able values (str, int, bool, bytes, list,
dict) with a ``"type"`` name and the protocol version under ``"v"``. The decoder rejects,
with :class:`~moriio.ports.MalformedMessageError` and a stable ``reason`` code:

- ``not_a_mapping``: the value is not a dict;
- ``unsupported_version``: ``"v"`` is not :data:`~moriio.domain.wire.messages.PROTOCOL_VERSION`;
- ``unknown_type``: an unknown ``"type"``;
- ``missing_field`` / ``unknown_field``: a field absent / not part of the type (unknown
  fields are rejected, not ignored: a protocol change bumps the version);
- ``bad_type``: a value of the wrong type (a bool is not an int; bytes are not str);
- ``out_of_range``: a number or size outside the limits in :mod:`~moriio.domain.wire.messages`;
- ``invalid_value``: a well-typed value that makes no sense (empty id, rank >= size,
  duplicate layer names, unknown transfer mode).
"""

from __future__ import annotations

from collections.abc import Callable

from moriio.domain.wire.capability import is_token
from moriio.domain.wire.fields import FieldReader, RejectReason, invalid, reject, value_type
from moriio.domain.wire.handshake import (
    ENGINE_TEXTS,
    LAYER_FIELDS,
    LAYER_TEXTS,
    Fingerprint,
    LayerFacts,
    LayerRegions,
)
from moriio.domain.wire.hosts import InvalidHostError, canonical_host
from moriio.domain.wire.messages import (
    MAX_BLOCK_ID,
    MAX_BLOCK_IDS,
    MAX_BLOCK_SIZE,
    MAX_DESCRIPTOR_BYTES,
    MAX_DESCRIPTORS_PER_LAYER,
    MAX_DP_SIZE,
    MAX_ENGINE_METADATA_BYTES,
    MAX_HOST_LEN,
    MAX_KIND_LEN,
    MAX_KV_HEADS,
    MAX_LAYERS,
    MAX_PORT,
    MAX_STR_LEN,
    MAX_TOKEN_LEN,
    MAX_TP_SIZE,
    MAX_WALL_TIME,
    PROTOCOL_VERSION,
    HandshakeRejected,
    HandshakeReply,
    HandshakeRequest,
    Message,
    Release,
    RemoteBlocks,
    WriteDone,
    WriteFailed,
)
from moriio.domain.wire.modes import TransferMode
from moriio.domain.wire.transfer_params import MAX_INSTANCE_ID_LEN, MAX_TRANSFER_ID_LEN
from moriio.ports import PeerAddress

TYPE_KEY = "type"
VERSION_KEY = "v"


# -- encoders ----------------------------------------------------------------------------


def _encode_fingerprint(fp: Fingerprint) -> dict[str, object]:
    return {
        "model_name": fp.model_name,
        "dtype": fp.dtype,
        "block_size": fp.block_size,
        "layout_kinds": list(fp.layout_kinds),
        "tp_size": fp.tp_size,
        "transfer_mode": fp.transfer_mode.value,
        "total_num_kv_heads": fp.total_num_kv_heads,
        "is_mla": fp.is_mla,
        **{name: getattr(fp, name) for name in ENGINE_TEXTS},
        "groups": list(fp.groups),
        "pp_size": fp.pp_size,
        "dcp_size": fp.dcp_size,
        "layers": [[getattr(layer, name) for name in LAYER_FIELDS] for layer in fp.layers],
    }


def _encode_layer(layer: LayerRegions) -> dict[str, object]:
    return {
        "name": layer.name,
        "descriptors": list(layer.descriptors),
        "num_blocks": layer.num_blocks,
        "block_len": layer.block_len,
        "block_stride": layer.block_stride,
    }


def _encode_handshake(msg: HandshakeRequest | HandshakeReply) -> dict[str, object]:
    return {
        "fingerprint": _encode_fingerprint(msg.fingerprint),
        "engine_metadata": msg.engine_metadata,
        "layers": [_encode_layer(layer) for layer in msg.layers],
        "control_host": msg.control.host,
        "control_port": msg.control.port,
        "dp_rank": msg.dp_rank,
        "tp_rank": msg.tp_rank,
        "instance_id": msg.instance_id,
    }


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
            return "handshake_request", _encode_handshake(msg)
        case HandshakeReply():
            return "handshake_reply", _encode_handshake(msg)
        case HandshakeRejected():
            return "handshake_rejected", {"reason": msg.reason}
    raise TypeError(f"not a moriio message: {type(msg).__name__}")


# -- decoders ----------------------------------------------------------------------------


def _host(f: FieldReader, key: str) -> str:
    """A host field: the canonical spelling, or rejected (never trimmed)."""
    raw = f.text(key, MAX_HOST_LEN)
    try:
        host = canonical_host(raw)
    except InvalidHostError as exc:
        raise invalid(key, str(exc)) from None
    if host != raw:
        raise invalid(key, f"host {raw!r:.80} is not in canonical form {host!r}")
    return host


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
        reply_to=PeerAddress(_host(f, "reply_host"), f.integer("reply_port", 1, MAX_PORT)),
        consumer_instance_id=f.text("consumer_instance_id", MAX_INSTANCE_ID_LEN),
        write_by=f.number("write_by", 0.0, MAX_WALL_TIME),
        token=_token(f, required=True),
    )
    if msg.consumer_tp_rank >= msg.consumer_tp_size:
        raise invalid("remote_blocks", "consumer_tp_rank must be < consumer_tp_size")
    return msg


def _decode_fingerprint(f: FieldReader) -> Fingerprint:
    model_name = f.text("model_name")
    dtype = f.text("dtype")
    block_size = f.integer("block_size", 1, MAX_BLOCK_SIZE)
    layout_kinds = f.text_array("layout_kinds", MAX_LAYERS, MAX_KIND_LEN)
    tp_size = f.integer("tp_size", 1, MAX_TP_SIZE)
    mode = f.text("transfer_mode")
    heads = f.integer("total_num_kv_heads", 1, MAX_KV_HEADS)
    is_mla = f.boolean("is_mla")
    texts = {name: f.text(name, MAX_STR_LEN, allow_empty=True) for name in ENGINE_TEXTS}
    groups = f.text_array("groups", MAX_LAYERS, MAX_KIND_LEN)
    pp_size = f.integer("pp_size", 1, MAX_TP_SIZE)
    dcp_size = f.integer("dcp_size", 1, MAX_TP_SIZE)
    raw_layers = f.array("layers", MAX_LAYERS)
    layers = tuple(
        _decode_layer_facts(raw, f"fingerprint.layers[{i}]") for i, raw in enumerate(raw_layers)
    )
    f.finish()
    if not layout_kinds:
        raise invalid("fingerprint.layout_kinds", "empty")
    if layers and len(layers) != len(layout_kinds):
        raise invalid("fingerprint.layers", "one entry per layout kind is required")
    try:
        transfer_mode = TransferMode(mode)
    except ValueError:
        raise invalid("fingerprint.transfer_mode", f"unknown mode {mode[:40]!r}") from None
    return Fingerprint(
        model_name=model_name,
        dtype=dtype,
        block_size=block_size,
        layout_kinds=layout_kinds,
        tp_size=tp_size,
        transfer_mode=transfer_mode,
        total_num_kv_heads=heads,
        is_mla=is_mla,
        groups=groups,
        pp_size=pp_size,
        dcp_size=dcp_size,
        layers=layers,
        **texts,
    )


def _decode_layer_facts(raw: object, where: str) -> LayerFacts:
    """``[name, spec, role, dtype, quant, block_size, kernel_block_size, heads, content_bytes,
    page_bytes]``: the fields of :class:`LayerFacts` in order."""
    if not isinstance(raw, list | tuple) or len(raw) != len(LAYER_FIELDS):
        raise invalid(where, f"expected a list of {len(LAYER_FIELDS)} fields")
    texts = raw[: len(LAYER_TEXTS)]
    numbers = raw[len(LAYER_TEXTS) :]
    if not all(type(t) is str and len(t) <= MAX_STR_LEN for t in texts):
        raise invalid(where, "text fields must be str of bounded length")
    if not all(type(n) is int and 0 < n <= MAX_BLOCK_ID for n in numbers):
        raise invalid(where, f"number fields must be ints in [1, {MAX_BLOCK_ID}]")
    try:
        return LayerFacts(*texts, *numbers)
    except ValueError as exc:
        raise invalid(where, str(exc)) from None


def _decode_layer(raw: object, where: str) -> LayerRegions:
    f = FieldReader(raw, where)
    name = f.text("name")
    descriptors = f.blob_array("descriptors", MAX_DESCRIPTORS_PER_LAYER, MAX_DESCRIPTOR_BYTES)
    num_blocks = f.integer("num_blocks", 1, MAX_BLOCK_ID)
    block_len = f.integer("block_len", 1, MAX_BLOCK_ID)
    block_stride = f.integer("block_stride", 0, MAX_BLOCK_ID)
    f.finish()
    if not descriptors:
        raise invalid(f"{where}.descriptors", "empty")
    try:
        return LayerRegions(
            name=name,
            descriptors=descriptors,
            num_blocks=num_blocks,
            block_len=block_len,
            block_stride=block_stride,
        )
    except ValueError as exc:
        raise invalid(where, str(exc)) from None


def _decode_handshake(
    f: FieldReader, kind: type[HandshakeRequest] | type[HandshakeReply], where: str
) -> HandshakeRequest | HandshakeReply:
    fingerprint = _decode_fingerprint(f.nested("fingerprint"))
    engine_metadata = f.blob("engine_metadata", MAX_ENGINE_METADATA_BYTES)
    raw_layers = f.array("layers", MAX_LAYERS)
    layers = tuple(_decode_layer(raw, f"{where}.layers[{i}]") for i, raw in enumerate(raw_layers))
    if len({layer.name for layer in layers}) != len(layers):
        raise invalid(f"{where}.layers", "duplicate layer names")
    control = PeerAddress(_host(f, "control_host"), f.integer("control_port", 1, MAX_PORT))
    dp_rank = f.integer("dp_rank", 0, MAX_DP_SIZE - 1)
    tp_rank = f.integer("tp_rank", 0, MAX_TP_SIZE - 1)
    instance_id = f.text("instance_id", MAX_INSTANCE_ID_LEN)
    if tp_rank >= fingerprint.tp_size:
        raise invalid(where, "tp_rank must be < fingerprint.tp_size")
    return kind(
        fingerprint=fingerprint,
        engine_metadata=engine_metadata,
        layers=layers,
        control=control,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        instance_id=instance_id,
    )


_DECODERS: dict[str, Callable[[FieldReader], Message]] = {
    "remote_blocks": _decode_remote_blocks,
    "write_done": lambda f: WriteDone(transfer_id=_transfer_id(f), token=_token(f, required=False)),
    "write_failed": lambda f: WriteFailed(
        transfer_id=_transfer_id(f),
        reason=f.text("reason", allow_empty=True),
        token=_token(f, required=False),
    ),
    "release": _decode_release,
    "handshake_request": lambda f: _decode_handshake(f, HandshakeRequest, "handshake_request"),
    "handshake_reply": lambda f: _decode_handshake(f, HandshakeReply, "handshake_reply"),
    "handshake_rejected": lambda f: HandshakeRejected(reason=f.text("reason", allow_empty=True)),
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
