"""Wire form of handshakes: fingerprints, layer regions, requests and replies.

Part of :mod:`moriio.domain.protocol.codec` (which lists the rejection reasons).
"""

from __future__ import annotations

from moriio.domain.kv.head_slices import MAX_PLANES, PLANE_FIELDS
from moriio.domain.params.transfer_params import MAX_GENERATION, MAX_INSTANCE_ID_LEN
from moriio.domain.protocol.fields import FieldReader, host_field, invalid
from moriio.domain.protocol.fingerprint import (
    ENGINE_TEXTS,
    LAYER_FIELDS,
    LAYER_TEXTS,
    OPTIONAL_ENGINE_TEXTS,
    Fingerprint,
    LayerFacts,
)
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import (
    MAX_BLOCK_ID,
    MAX_BLOCK_SIZE,
    MAX_DESCRIPTOR_BYTES,
    MAX_DESCRIPTORS_PER_LAYER,
    MAX_DP_SIZE,
    MAX_ENGINE_METADATA_BYTES,
    MAX_GROUP_LEN,
    MAX_KIND_LEN,
    MAX_KV_HEADS,
    MAX_LAYERS,
    MAX_PORT,
    MAX_SPAN_OFFSET,
    MAX_SPANS,
    MAX_STR_LEN,
    MAX_TP_SIZE,
    HandshakeReply,
    HandshakeRequest,
    Retired,
    RetiredAck,
)
from moriio.domain.values.modes import TransferMode
from moriio.ports import PeerAddress

MAX_SLICE_INTS = MAX_PLANES * (PLANE_FIELDS + 1)  # one slice layout on the wire


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
        "span": layer.span,
        "span_offset": layer.span_offset,
        "slices": [list(wire) for wire in layer.slices],
    }


def encode_handshake(msg: HandshakeRequest | HandshakeReply) -> dict[str, object]:
    return {
        "fingerprint": _encode_fingerprint(msg.fingerprint),
        "engine_metadata": msg.engine_metadata,
        "layers": [_encode_layer(layer) for layer in msg.layers],
        "control_host": msg.control.host,
        "control_port": msg.control.port,
        "dp_rank": msg.dp_rank,
        "tp_rank": msg.tp_rank,
        "instance_id": msg.instance_id,
        "generation": msg.generation,
        "spans": list(msg.spans),
    }


def _decode_fingerprint(f: FieldReader) -> Fingerprint:
    model_name = f.text("model_name")
    dtype = f.text("dtype")
    block_size = f.integer("block_size", 1, MAX_BLOCK_SIZE)
    layout_kinds = f.text_array("layout_kinds", MAX_LAYERS, MAX_KIND_LEN)
    tp_size = f.integer("tp_size", 1, MAX_TP_SIZE)
    mode = f.text("transfer_mode")
    heads = f.integer("total_num_kv_heads", 1, MAX_KV_HEADS)
    is_mla = f.boolean("is_mla")
    texts = {
        name: f.optional_text(name)
        if name in OPTIONAL_ENGINE_TEXTS
        else f.text(name, allow_empty=True)
        for name in ENGINE_TEXTS
    }
    groups = f.text_array("groups", MAX_LAYERS, MAX_GROUP_LEN)
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
    span = f.integer("span", -1, MAX_SPANS - 1)
    span_offset = f.integer("span_offset", 0, MAX_SPAN_OFFSET)
    slices = tuple(
        _slice_ints(raw, f"{where}.slices[{i}]") for i, raw in enumerate(f.array("slices", 64))
    )
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
            span=span,
            span_offset=span_offset,
            slices=slices,
        )
    except ValueError as exc:
        raise invalid(where, str(exc)) from None


def _slice_ints(raw: object, where: str) -> tuple[int, ...]:
    """One group's slice layout as ints (checked as a layout by :class:`LayerRegions`)."""
    if not isinstance(raw, list | tuple) or len(raw) > MAX_SLICE_INTS:
        raise invalid(where, f"expected a list of at most {MAX_SLICE_INTS} ints")
    if not all(type(n) is int and 0 <= n <= MAX_BLOCK_ID for n in raw):
        raise invalid(where, f"entries must be ints in [0, {MAX_BLOCK_ID}]")
    return tuple(raw)


def decode_handshake(
    f: FieldReader, kind: type[HandshakeRequest] | type[HandshakeReply], where: str
) -> HandshakeRequest | HandshakeReply:
    fingerprint = _decode_fingerprint(f.nested("fingerprint"))
    engine_metadata = f.blob("engine_metadata", MAX_ENGINE_METADATA_BYTES)
    raw_layers = f.array("layers", MAX_LAYERS)
    layers = tuple(_decode_layer(raw, f"{where}.layers[{i}]") for i, raw in enumerate(raw_layers))
    if len({layer.name for layer in layers}) != len(layers):
        raise invalid(f"{where}.layers", "duplicate layer names")
    control = PeerAddress(host_field(f, "control_host"), f.integer("control_port", 1, MAX_PORT))
    dp_rank = f.integer("dp_rank", 0, MAX_DP_SIZE - 1)
    tp_rank = f.integer("tp_rank", 0, MAX_TP_SIZE - 1)
    instance_id = f.text("instance_id", MAX_INSTANCE_ID_LEN)
    generation = f.optional_integer("generation", 1, MAX_GENERATION, 1)
    spans = f.blob_array("spans", MAX_SPANS, MAX_DESCRIPTOR_BYTES)
    if tp_rank >= fingerprint.tp_size:
        raise invalid(where, "tp_rank must be < fingerprint.tp_size")
    if any(layer.span >= len(spans) for layer in layers):
        raise invalid(f"{where}.layers", "a layer names a span the handshake does not carry")
    return kind(
        fingerprint=fingerprint,
        engine_metadata=engine_metadata,
        layers=layers,
        control=control,
        dp_rank=dp_rank,
        tp_rank=tp_rank,
        instance_id=instance_id,
        generation=generation,
        spans=spans,
    )


def encode_retirement(msg: Retired | RetiredAck) -> tuple[str, dict[str, object]]:
    """The wire type and body of a :class:`Retired` notice or its acknowledgement."""
    body: dict[str, object] = {
        "instance_id": msg.instance_id,
        "generation": msg.generation,
        "control_host": msg.control.host,
        "control_port": msg.control.port,
    }
    return ("retired" if isinstance(msg, Retired) else "retired_ack"), body


def decode_retirement(
    f: FieldReader, kind: type[Retired] | type[RetiredAck]
) -> Retired | RetiredAck:
    return kind(
        instance_id=f.text("instance_id", MAX_INSTANCE_ID_LEN),
        generation=f.integer("generation", 1, MAX_GENERATION),
        control=PeerAddress(host_field(f, "control_host"), f.integer("control_port", 1, MAX_PORT)),
    )
