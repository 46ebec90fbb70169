"""The handshake refuses a peer whose bytes mean something else, naming what differs."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from moriio.domain.protocol.codec import WIRE_CODEC
from moriio.domain.protocol.fingerprint import (
    STATE_GROUP_MARK,
    Fingerprint,
    IncompatiblePeerError,
    LayerFacts,
)
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.messages import HandshakeRequest
from moriio.domain.values.modes import TransferMode
from moriio.domain.worker.peer_checks import remote_strides
from moriio.ports import MalformedMessageError, PeerAddress


def _layer(name: str, **changes: object) -> LayerFacts:
    base = LayerFacts(
        name=name,
        spec="MLAAttentionSpec",
        role="",
        dtype="bfloat16",
        quant="NONE",
        block_size=16,
        kernel_block_size=16,
        heads=1,
        content_bytes=1152,
        page_bytes=16 * 1152,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _fp(**changes: object) -> Fingerprint:
    base = Fingerprint(
        model_name="tiny-deepseek-v2",
        dtype="bfloat16",
        block_size=16,
        layout_kinds=("mla", "mla"),
        tp_size=1,
        transfer_mode=TransferMode.READ,
        total_num_kv_heads=1,
        is_mla=True,
        vllm_version="0.32.0",
        kv_layout="LBNHC",
        cache_dtype="auto",
        attn_backend="CPU_MLA",
        platform="cpu",
        groups=("MLAAttentionSpec:2",),
        layers=(_layer("model.layers.0.self_attn.attn"), _layer("model.layers.1.self_attn.attn")),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_equal_engines_are_compatible() -> None:
    _fp().check_compatible(_fp())


def test_fp8_caches_of_different_formats_are_refused_by_their_cache_dtypes() -> None:
    e4m3 = _fp(cache_dtype="fp8_e4m3", dtype="float32")
    e5m2 = _fp(cache_dtype="fp8_e5m2", dtype="float32")
    with pytest.raises(IncompatiblePeerError, match=r"cache_dtype differs.*'fp8_e4m3'.*'fp8_e5m2'"):
        e4m3.check_compatible(e5m2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vllm_version", "0.31.0"),
        ("kv_layout", "LBHNC"),
        ("attn_backend", "FLASHINFER"),
        ("platform", "cuda"),
        ("speculative", "mtp:draft:1:auto"),
        ("groups", ("UniformTypeKVCacheSpecs:2",)),
        ("pp_size", 2),
        ("dcp_size", 2),
    ],
)
def test_every_engine_fact_that_gives_bytes_meaning_is_compared(field: str, value: object) -> None:
    (diff,) = _fp().diff(_fp(**{field: value}))
    assert (diff.field, diff.theirs) == (field, value)


def test_a_layer_whose_page_differs_is_named_with_every_differing_field() -> None:
    theirs = _fp(
        layers=(
            _fp().layers[0],
            _layer(
                "model.layers.1.self_attn.attn",
                page_bytes=16 * 1312,
                content_bytes=1312,
                role="indexer",
            ),
        )
    )
    diffs = _fp().diff(theirs)
    assert [d.field for d in diffs] == [
        "layers[1].role",
        "layers[1].content_bytes",
        "layers[1].page_bytes",
    ]
    assert all(d.note == "layer 'model.layers.1.self_attn.attn'" for d in diffs)
    with pytest.raises(IncompatiblePeerError, match=r"layers\[1\]\.page_bytes differs"):
        _fp().check_compatible(theirs)


def test_layer_order_and_kernel_blocks_are_compared() -> None:
    swapped = _fp(layers=tuple(reversed(_fp().layers)))
    assert [d.field for d in _fp().diff(swapped)] == ["layers[0].name"]
    split = _fp(
        layers=(_layer("model.layers.0.self_attn.attn", kernel_block_size=8), _fp().layers[1])
    )
    assert [d.field for d in _fp().diff(split)] == ["layers[0].kernel_block_size"]


def test_a_peer_without_an_engine_is_compared_on_what_it_declares() -> None:
    bare = _fp(layers=(), vllm_version="", kv_layout="", cache_dtype="", groups=())
    assert _fp().diff(bare) == []
    (diff,) = _fp().diff(dataclasses.replace(bare, cache_dtype="fp8_e4m3"))
    assert (diff.field, diff.ours, diff.theirs) == ("cache_dtype", "auto", "fp8_e4m3")


def test_layer_facts_must_match_the_layer_count_and_be_valid() -> None:
    with pytest.raises(ValueError, match="1 layer facts for 2 layout kinds"):
        _fp(layers=(_layer("a"),))
    with pytest.raises(ValueError, match="layer page_bytes must be a positive int"):
        _layer("a", page_bytes=0)


engine_texts = st.text(max_size=40)


@st.composite
def engine_fingerprints(draw: st.DrawFn) -> Fingerprint:
    n = draw(st.integers(min_value=1, max_value=4))
    layers = tuple(
        _layer(
            f"layer{i}",
            spec=draw(st.sampled_from(["FullAttentionSpec", "MLAAttentionSpec"])),
            role=draw(st.sampled_from(["", "indexer"])),
            page_bytes=draw(st.integers(min_value=1, max_value=1 << 30)),
        )
        for i in range(n)
    )
    return _fp(
        layout_kinds=("mla",) * n,
        layers=layers,
        vllm_version=draw(engine_texts),
        kv_layout=draw(engine_texts),
        cache_dtype=draw(engine_texts),
        groups=tuple(draw(st.lists(st.text(min_size=1, max_size=30), max_size=3))),
        pp_size=draw(st.integers(min_value=1, max_value=8)),
    )


def _request(fingerprint: Fingerprint, layers: tuple[LayerRegions, ...] = ()) -> HandshakeRequest:
    return HandshakeRequest(
        fingerprint=fingerprint,
        engine_metadata=b"agent",
        layers=layers,
        control=PeerAddress("127.0.0.1", 7000),
        dp_rank=0,
        tp_rank=0,
        instance_id="i-1",
    )


@given(engine_fingerprints())
def test_engine_fingerprints_round_trip_through_the_wire(fingerprint: Fingerprint) -> None:
    message = _request(fingerprint)
    assert _decode(_encode(message)) == message


def _encode(message: HandshakeRequest) -> dict[str, object]:
    """The message as it arrives: through msgpack and back."""
    raw = msgpack.unpackb(msgpack.packb(WIRE_CODEC.encode(message)), raw=False)
    assert isinstance(raw, dict)
    return raw


def _decode(raw: dict[str, object]) -> object:
    return WIRE_CODEC.decode(raw)


def _raw_handshake() -> dict[str, object]:
    raw = _encode(_request(_fp()))
    assert isinstance(raw, dict)
    return raw


@pytest.mark.parametrize(
    ("layer", "reason"),
    [
        (["x"] * 10, "number fields"),
        (["x", "S", "", "bf16", "NONE", 16, 16, 1, 0, 5], "number fields"),
        (["x", "S", "", "bf16", "NONE", 16, 16, 1, 2], "expected a list of 10"),
        (["x", "S", "", "bf16", "NONE", 16, 16, True, 2, 5], "number fields"),
        (["", "S", "", "bf16", "NONE", 16, 16, 1, 2, 5], "layer name"),
        ("layer", "expected a list"),
    ],
)
def test_hostile_layer_facts_are_rejected_at_decode(layer: object, reason: str) -> None:
    raw = _raw_handshake()
    fingerprint = raw["fingerprint"]
    assert isinstance(fingerprint, dict)
    fingerprint["layers"] = [layer, fingerprint["layers"][1]]  # type: ignore[index]
    with pytest.raises(MalformedMessageError, match=reason):
        _decode(raw)


def test_a_block_stride_below_the_block_length_is_rejected_at_decode() -> None:
    layer = LayerRegions("l0", (b"d",), 8, 64, 128)
    raw = _encode(_request(_fp(), (layer,)))
    raw["layers"][0]["block_stride"] = 32  # type: ignore[index]
    with pytest.raises(MalformedMessageError, match="blocks would overlap"):
        _decode(raw)


def test_block_lengths_must_match_and_a_differing_stride_is_the_peer_s_own() -> None:
    ours = {
        "l0": LayerRegions("l0", (b"d",), 8, 64, 64),
        "l1": LayerRegions("l1", (b"d",), 8, 32, 96),
    }
    theirs = [LayerRegions("l0", (b"e",), 4, 64, 64), LayerRegions("l1", (b"e",), 4, 32, 128)]
    assert remote_strides(ours, theirs) == {"l1": 128}
    with pytest.raises(ValueError, match=r"layer 'l0' block_len differs \(ours=64, theirs=48\)"):
        remote_strides(ours, [LayerRegions("l0", (b"e",), 4, 48, 64)])


def test_a_state_groups_per_rank_shapes_may_differ_between_tp_sizes_its_kind_may_not() -> None:
    """A rank holds its shard of a state: its shapes and page scale with the TP size, so
    peers of different TP sizes compare the rest (the shards are checked per layer)."""
    attention = _fp(groups=("FullAttentionSpec:2",), total_num_kv_heads=1, is_mla=False)
    assert attention.incompatibilities(dataclasses.replace(attention, tp_size=2)) == []
    state = ("FullAttentionSpec:1", f"MambaSpec:1{STATE_GROUP_MARK}[[3, 512]]/bfloat16/gdn/64")
    hybrid = dataclasses.replace(attention, groups=state)
    half = (state[0], state[1].replace("[[3, 512]]", "[[3, 256]]").replace("/64", "/32"))
    assert hybrid.incompatibilities(dataclasses.replace(hybrid, tp_size=2, groups=half)) == []
    other = (state[0], state[1].replace("/gdn/", "/mamba2/"))
    (diff,) = hybrid.incompatibilities(dataclasses.replace(hybrid, tp_size=2, groups=other))
    assert diff.field == "groups"
    wider = (state[0], state[1].replace("[[3, 512]]", "[[3, 1024]]"))
    assert [d.field for d in hybrid.diff(dataclasses.replace(hybrid, groups=wider))] == ["groups"]
    assert [
        d.field for d in hybrid.incompatibilities(dataclasses.replace(hybrid, groups=wider))
    ] == ["groups"]  # equal TP sizes: every byte of a state page compares
