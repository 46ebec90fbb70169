"""Layout recognition: every supported KV-cache shape, padded strides, and each rejection."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from moriio.domain.kv.layout import LayerGeometry, LayerSpec, LayoutKind, describe_layout

BF16 = 2
SPEC = LayerSpec(block_size=4, num_kv_heads=2, head_size=3)
MLA_SPEC = LayerSpec(block_size=4, num_kv_heads=1, head_size=3, kind="mla")


def dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def describe(shape: tuple[int, ...], spec: LayerSpec = SPEC, itemsize: int = BF16) -> LayerGeometry:
    return describe_layout(shape, dense(shape), itemsize, spec)


# -- the worked examples (bf16, bs=4, H=2, D=3) -------------------------------------------


@pytest.mark.parametrize("shape", [(2, 8, 4, 2, 3), (2, 8, 2, 4, 3)], ids=["NHD", "HND"])
def test_separated_layout_geometry(shape: tuple[int, ...]) -> None:
    g = describe(shape)
    assert g.kind is LayoutKind.SEPARATED
    assert (g.num_blocks, g.block_size, g.kernel_blocks_per_block) == (8, 4, 1)
    assert g.block_stride_bytes == 24 * BF16
    assert g.block_len == 48
    assert g.v_offset_bytes == 192 * BF16
    assert g.remote_v_offset(16) == 384 * BF16
    assert g.transfers_per_block == 2
    assert g.slot_size_bytes == 2 * 3 * BF16
    assert g.region_len == 2 * 8 * 48  # two registration regions of 8 x 48 B


@pytest.mark.parametrize("shape", [(8, 2, 4, 2, 3), (8, 2, 2, 4, 3)], ids=["NHD", "HND"])
def test_interleaved_layout_geometry(shape: tuple[int, ...]) -> None:
    g = describe(shape)
    assert g.kind is LayoutKind.INTERLEAVED
    assert (g.num_blocks, g.kernel_blocks_per_block) == (8, 1)
    assert g.block_stride_bytes == 48 * BF16
    assert g.block_len == 48
    assert g.v_offset_bytes == 24 * BF16
    assert g.remote_v_offset(16) == 24 * BF16  # the peer uses the same in-page offset
    assert g.transfers_per_block == 2
    assert g.region_len == 8 * 2 * 48


def test_mla_layout_geometry() -> None:
    g = describe((8, 4, 3), MLA_SPEC)
    assert g.kind is LayoutKind.MLA
    assert (g.num_blocks, g.block_len, g.block_stride_bytes) == (8, 24, 24)
    assert (g.transfers_per_block, g.v_offset_bytes) == (1, 0)
    assert g.region_len == 8 * 24


def test_geometry_is_frozen_hashable_and_keyed_by_inputs() -> None:
    a = describe((2, 8, 4, 2, 3))
    b = describe((2, 8, 4, 2, 3))
    assert a == b
    assert hash(a) == hash(b)
    assert a.key == ((2, 8, 4, 2, 3), dense((2, 8, 4, 2, 3)), BF16, SPEC)
    assert (a.shape, a.strides, a.itemsize) == a.key[:3]
    assert describe((8, 2, 4, 2, 3)).key != a.key
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.num_blocks = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPEC.block_size = 8  # type: ignore[misc]


def test_numpy_ints_are_accepted_and_normalised() -> None:
    shape = tuple(np.int64(n) for n in (2, 8, 4, 2, 3))
    g = describe_layout(shape, dense((2, 8, 4, 2, 3)), np.int64(2), SPEC)  # type: ignore[arg-type]
    assert g.key == describe((2, 8, 4, 2, 3)).key
    assert all(type(n) is int for n in g.shape)


# -- kernel sub-blocks -----------------------------------------------------------------------

KSPEC = LayerSpec(block_size=8, num_kv_heads=2, head_size=3)


@pytest.mark.parametrize("shape", [(2, 16, 4, 2, 3), (2, 16, 2, 4, 3)], ids=["dim2", "dim3"])
def test_separated_kernel_blocks_stay_separated(shape: tuple[int, ...]) -> None:
    g = describe(shape, KSPEC)
    assert g.kind is LayoutKind.SEPARATED
    assert (g.num_blocks, g.block_size, g.kernel_blocks_per_block) == (8, 8, 2)
    assert g.block_len == 2 * 24 * BF16  # two adjacent kernel pages
    assert g.block_stride_bytes == 2 * 24 * BF16
    assert g.v_offset_bytes == 16 * 24 * BF16
    assert g.remote_v_offset(5) == 5 * 96
    assert g.transfers_per_block == 2


@pytest.mark.parametrize("shape", [(16, 2, 4, 2, 3), (16, 2, 2, 4, 3)], ids=["dim2", "dim3"])
def test_interleaved_kernel_blocks_move_one_run_per_block(shape: tuple[int, ...]) -> None:
    g = describe(shape, KSPEC)
    assert g.kind is LayoutKind.KERNEL_BLOCKS
    assert (g.num_blocks, g.kernel_blocks_per_block) == (8, 2)
    assert g.block_len == g.block_stride_bytes == 2 * 2 * 24 * BF16
    assert (g.transfers_per_block, g.v_offset_bytes) == (1, 0)
    assert g.slot_size_bytes == 2 * 2 * 3 * BF16
    assert g.region_len == 16 * 2 * 24 * BF16


def test_kernel_axis_found_from_the_spec_when_heads_are_unknown() -> None:
    spec = LayerSpec(block_size=8, num_kv_heads=None, head_size=3)
    g = describe((2, 16, 4, 3, 3), spec)  # dim 3 (3) does not divide 8, dim 2 (4) does
    assert (g.num_blocks, g.kernel_blocks_per_block, g.block_len) == (8, 2, 2 * 36 * BF16)


def test_ambiguous_kernel_axis_is_rejected() -> None:
    spec = LayerSpec(block_size=16, num_kv_heads=None, head_size=None)
    with pytest.raises(ValueError, match=r"Ambiguous kernel-block axis.*\(2, 32, 8, 2, 3\)"):
        describe((2, 32, 8, 2, 3), spec)


def test_equal_sized_candidate_axes_are_not_ambiguous() -> None:
    spec = LayerSpec(block_size=8, num_kv_heads=None, head_size=None)
    assert describe((2, 16, 4, 4, 3), spec).kernel_blocks_per_block == 2


def test_an_axis_equal_to_the_block_size_wins_over_a_kernel_split() -> None:
    spec = LayerSpec(block_size=4, num_kv_heads=None, head_size=None)
    g = describe((2, 8, 4, 2, 3), spec)  # dim 3 (2) would also divide 4
    assert (g.num_blocks, g.kernel_blocks_per_block) == (8, 1)


def test_kernel_blocks_must_form_whole_logical_blocks() -> None:
    with pytest.raises(ValueError, match=r"\(2, 15, 4, 2, 3\).*whole blocks"):
        describe((2, 15, 4, 2, 3), KSPEC)


def test_padded_kernel_pages_are_rejected_when_a_split_block_would_not_be_contiguous() -> None:
    shape = (2, 16, 4, 2, 3)
    strides = (16 * 30, 30, 6, 3, 1)  # kernel pages of 24 elements padded to 30
    with pytest.raises(ValueError, match="not adjacent"):
        describe_layout(shape, strides, BF16, KSPEC)
    inter = (16, 2, 4, 2, 3)
    with pytest.raises(ValueError, match="not one contiguous run"):
        describe_layout(inter, (50, 25, 6, 3, 1), BF16, KSPEC)


# -- packed CPU pages --------------------------------------------------------------------------


def test_packed_cpu_layout_moves_whole_pages() -> None:
    shape = (8192, 2, 32, 128)  # vLLM CPU attention: [nb, H, bs, Dk+Dv], float32
    g = describe_layout(shape, (8192, 4096, 128, 1), 4, LayerSpec(32, 2, 64))
    assert g.kind is LayoutKind.PACKED
    assert (g.num_blocks, g.block_len, g.block_stride_bytes) == (8192, 32768, 32768)
    assert g.transfers_per_block == 1
    assert g.region_len == 256 * 2**20


def test_packed_layout_with_distinct_v_head_size() -> None:
    spec = LayerSpec(block_size=4, num_kv_heads=2, head_size=3, head_size_v=5)
    g = describe((6, 2, 4, 8), spec)
    assert (g.kind, g.block_len) == (LayoutKind.PACKED, 2 * 4 * 8 * BF16)
    with pytest.raises(ValueError, match=r"\(6, 2, 4, 6\)"):
        describe((6, 2, 4, 6), spec)


def test_four_dim_shape_that_does_not_match_its_spec_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"view \(8, 2, 4, 5\) does not match its spec"):
        describe((8, 2, 4, 5))
    with pytest.raises(ValueError, match=r"\(8, 4, 2, 6\)"):
        describe((8, 4, 2, 6))  # heads and block size swapped


# -- padded and permuted strides -------------------------------------------------------------


def test_padded_separated_layout_uses_real_strides() -> None:
    g = describe_layout((2, 8, 4, 2, 3), (240, 30, 6, 3, 1), BF16, SPEC)
    assert g.kind is LayoutKind.SEPARATED
    assert (g.block_len, g.block_stride_bytes, g.v_offset_bytes) == (48, 60, 480)
    assert g.remote_v_offset(16) == 16 * 60
    assert g.region_len == BF16 * (1 + 240 + 7 * 30 + 3 * 6 + 3 + 2)


def test_padded_interleaved_and_mla_layouts_use_real_strides() -> None:
    g = describe_layout((8, 2, 4, 2, 3), (50, 25, 6, 3, 1), BF16, SPEC)
    assert g.kind is LayoutKind.INTERLEAVED
    assert (g.block_len, g.block_stride_bytes, g.v_offset_bytes) == (48, 100, 50)
    m = describe_layout((8, 4, 3), (16, 3, 1), BF16, MLA_SPEC)
    assert (m.block_len, m.block_stride_bytes) == (24, 32)


def test_kind_follows_the_bytes_for_permuted_views() -> None:
    # A [2, nb, ...] view whose V page lives inside each block page is interleaved memory.
    g = describe_layout((2, 8, 4, 2, 3), (24, 48, 6, 3, 1), BF16, SPEC)
    assert (g.kind, g.block_stride_bytes, g.v_offset_bytes) == (LayoutKind.INTERLEAVED, 96, 48)
    # A [nb, 2, ...] view whose V half follows all K blocks is separated memory.
    s = describe_layout((8, 2, 4, 2, 3), (24, 192, 6, 3, 1), BF16, SPEC)
    assert (s.kind, s.block_stride_bytes, s.v_offset_bytes) == (LayoutKind.SEPARATED, 48, 384)


def test_leading_two_is_read_as_the_kv_axis_for_a_two_block_cache() -> None:
    assert describe((2, 2, 4, 2, 3)).kind is LayoutKind.SEPARATED


@pytest.mark.parametrize(
    ("shape", "strides", "match"),
    [
        ((2, 8, 4, 2, 3), (384, 48, 12, 3, 1), "page is not contiguous"),
        ((2, 8, 4, 2, 3), (100, 24, 6, 3, 1), "overlap"),
        ((8, 2, 4, 2, 3), (30, 24, 6, 3, 1), "overlap"),
        ((8, 4, 3), (16, 4, 1), "not contiguous"),
        ((8, 4, 3), (10, 3, 1), "overlap"),
        ((8, 2, 4, 2, 3), (48, 24, 6, 3, -1), "negative"),
    ],
)
def test_non_contiguous_chunks_are_rejected(
    shape: tuple[int, ...], strides: tuple[int, ...], match: str
) -> None:
    spec = MLA_SPEC if len(shape) == 3 else SPEC
    with pytest.raises(ValueError, match=match):
        describe_layout(shape, strides, BF16, spec)


# -- rejections ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "spec", "match"),
    [
        ((8, 4, 6), SPEC, r"\(8, 4, 6\) for an attention layer"),
        ((2, 8, 4, 2, 3, 1), SPEC, r"\(2, 8, 4, 2, 3, 1\)"),
        ((3, 8, 4, 2, 3), SPEC, r"\(3, 8, 4, 2, 3\).*K/V axis of size 2"),
        ((2, 8, 4, 2, 5), SPEC, r"\(2, 8, 4, 2, 5\).*no block axis"),
        ((2, 8, 3, 2, 3), SPEC, r"\(2, 8, 3, 2, 3\).*no block axis"),
        ((2, 8, 4, 3), MLA_SPEC, r"\(2, 8, 4, 3\) for an MLA layer"),
        ((8, 8, 3), MLA_SPEC, r"\(8, 8, 3\) for an MLA layer"),
        ((8, 4, 5), MLA_SPEC, r"\(8, 4, 5\) for an MLA layer"),
        ((8, 0, 3), MLA_SPEC, "empty dimension"),
    ],
)
def test_unsupported_shapes_name_the_shape(
    shape: tuple[int, ...], spec: LayerSpec, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        describe(shape, spec)


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        describe_layout((8, 4, 3), (12, 3), BF16, MLA_SPEC)
    with pytest.raises(ValueError, match="itemsize"):
        describe_layout((8, 4, 3), (12, 3, 1), 0, MLA_SPEC)
    with pytest.raises(ValueError, match="shape must be a sequence of ints"):
        describe_layout((8, 4.0, 3), (12, 3, 1), BF16, MLA_SPEC)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_size": 0, "num_kv_heads": 2, "head_size": 3},
        {"block_size": -4, "num_kv_heads": 2, "head_size": 3},
        {"block_size": True, "num_kv_heads": 2, "head_size": 3},
        {"block_size": 4.0, "num_kv_heads": 2, "head_size": 3},
        {"block_size": 4, "num_kv_heads": 0, "head_size": 3},
        {"block_size": 4, "num_kv_heads": 2, "head_size": -3},
        {"block_size": 4, "num_kv_heads": 2, "head_size": 3, "head_size_v": 0},
        {"block_size": 4, "num_kv_heads": 2, "head_size": 3, "kind": "mamba"},
    ],
)
def test_layer_spec_validates_its_fields(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be"):
        LayerSpec(**kwargs)  # type: ignore[arg-type]


def test_layer_spec_allows_unknown_head_dims_and_defaults_to_attention() -> None:
    spec = LayerSpec(16, None, None)
    assert spec.kind == "attention"
    assert hash(spec) == hash(LayerSpec(16, None, None))
