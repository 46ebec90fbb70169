"""Every KV-cache view vLLM 0.32's backends hand a connector, planned and moved byte for byte.

Each row builds the view the way vLLM does (its own ``compute_layout_strides``,
``KVCacheTensor`` and ``create_kv_cache_views`` over one flat int8 buffer) from the spec and
page order the backend declares (``vllm-0.32`` sources: ``v1/kv_cache_interface.py``,
``v1/worker/utils.py``; per backend the spec fields its ``get_kv_cache_spec`` publishes). The
geometry comes from :func:`moriio.vllm_plugin.kv_views.to_layer_spec` and ``describe_layout``;
the plan is applied to raw bytes and compared with a naive per-block copy of the views, on
peers whose block counts differ. What cannot be moved correctly must be refused by name.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np
import pytest
import torch
from vllm.v1.kv_cache_interface import KVCacheSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

from moriio.domain.kv.layout import LayerGeometry, LayoutKind, describe_layout
from moriio.domain.kv.planner import plan_transfer
from moriio.vllm_plugin.device_copies import DeviceCopier
from moriio.vllm_plugin.kv_views import to_layer_spec
from support.kv_views import BF16, LOCAL_BLOCKS, REMOTE_BLOCKS, ROWS, Row, attn, mla
from support.kv_views import views as build_views

L = KVCacheLayout


def _geometry(spec: KVCacheSpec, view: torch.Tensor) -> LayerGeometry:
    return describe_layout(
        tuple(view.shape), tuple(view.stride()), view.element_size(), to_layer_spec(spec)
    )


def _bytes(view: torch.Tensor) -> torch.Tensor:
    return view.view(torch.uint8)


@pytest.mark.parametrize("mover", ["descriptors", "device copies"])
@pytest.mark.parametrize("name", list(ROWS))
def test_every_backend_view_is_planned_and_moved_like_a_naive_per_block_copy(
    name: str, mover: str
) -> None:
    """``device copies``: the same plan as gathered rows (same-host device copies)."""
    row = ROWS[name]
    copier = DeviceCopier(torch.device("cpu"), memcpy_descriptors=0)
    local_raw, local_views = build_views(row, LOCAL_BLOCKS)
    remote_raw, remote_views = build_views(row, REMOTE_BLOCKS)
    expected_raw, expected_views = build_views(row, LOCAL_BLOCKS, local_raw.clone())
    got = local_raw.clone().view(torch.uint8).numpy()
    src = remote_raw.view(torch.uint8).numpy()
    pairs = [(4, 8), (0, 2), (5, 0), (1, 1)]
    views = zip(local_views, remote_views, expected_views, strict=True)
    for (spec, local), (_, remote), (_, naive) in views:
        mine, theirs = _geometry(spec, local), _geometry(spec, remote)
        assert mine.kind is row.kind
        assert (mine.num_blocks, theirs.num_blocks) == (LOCAL_BLOCKS, REMOTE_BLOCKS)
        assert mine.block_len == theirs.block_len
        k = mine.kernel_blocks_per_block
        assert k == spec.block_size // (row.kernel_block_size or spec.block_size)
        plan = plan_transfer(
            mine,
            [p[0] for p in pairs],
            [p[1] for p in pairs],
            theirs.num_blocks,
            theirs.block_stride_bytes,
        )
        base_local = local.data_ptr() - local_raw.data_ptr()
        base_remote = remote.data_ptr() - remote_raw.data_ptr()
        if mover == "device copies":
            offsets = (plan.local_offsets + base_local, plan.remote_offsets + base_remote)
            dst, source = torch.from_numpy(got), torch.from_numpy(src)
            copier.copy(dst, source, offsets[0], offsets[1], plan.sizes)
        for lo, ro, size in zip(*plan.to_lists(), strict=True):
            if mover == "descriptors":
                got[base_local + lo : base_local + lo + size] = src[
                    base_remote + ro : base_remote + ro + size
                ]
        for lb, rb in pairs:
            _bytes(naive)[lb * k : (lb + 1) * k] = _bytes(remote)[rb * k : (rb + 1) * k]
    assert np.array_equal(got, expected_raw.view(torch.uint8).numpy()), name
    assert not np.array_equal(got, local_raw.view(torch.uint8).numpy())


def test_the_page_is_the_bytes_the_spec_says_it_is() -> None:
    for name in (
        "flashinfer nvfp4 LBHNC",
        "flashmla_sparse fp8_ds_mla",
        "triton int8 per-token-head",
    ):
        _, ((spec, view),) = build_views(ROWS[name], LOCAL_BLOCKS)
        assert _geometry(spec, view).block_len == spec.real_page_size_bytes, name


@pytest.mark.parametrize(
    ("spec", "layout", "match"),
    [
        (attn(16, 4, 128, BF16), L.LHBNC, "head slots are not two planes"),
        (attn(16, 4, 128, BF16), L.BHLNC, "head slots are not two planes"),
    ],
    ids=["aiter_fa LHBNC, 4 head planes", "BHLNC, 4 head planes, 2 layers"],
)
def test_head_planes_beyond_two_are_refused_by_name(
    spec: KVCacheSpec, layout: KVCacheLayout, match: str
) -> None:
    _, views = build_views(Row((spec, spec), layout, LayoutKind.PACKED), LOCAL_BLOCKS)
    view = views[0][1]
    with pytest.raises(ValueError, match=match):
        _geometry(spec, view)


@pytest.mark.parametrize(
    ("declared", "match"),
    [
        (attn(16, 2, 64, BF16), "does not match its spec"),  # heads differ from the view
        (attn(24, 4, 64, BF16), "states per kernel block"),  # 16-token pages of 24?
        (mla(16, 256, BF16), "for an MLA layer"),  # an MLA spec for an attention view
        (attn(16, 4, 64, BF16, state_content_bytes=200), "does not match its spec"),
    ],
)
def test_a_view_that_does_not_match_its_spec_is_refused(declared: KVCacheSpec, match: str) -> None:
    _, ((_, view),) = build_views(ROWS["flash_attn bf16 LBNHC"], LOCAL_BLOCKS)
    with pytest.raises(ValueError, match=match):
        describe_layout(tuple(view.shape), tuple(view.stride()), 2, to_layer_spec(declared))


def test_a_shape_no_backend_produces_is_refused() -> None:
    spec = to_layer_spec(attn(16, 4, 64, BF16))
    with pytest.raises(ValueError, match=r"unsupported KV cache shape \(6, 16, 512\)"):
        describe_layout((6, 16, 512), (8192, 512, 1), 2, spec)
    sparse = replace(spec, num_states=None)
    shape = (6, 4, 16, 128)
    strides = (prod(shape[1:]) - 1, 16 * 128, 128, 1)  # pages overlap
    with pytest.raises(ValueError, match="overlap"):
        describe_layout(shape, strides, 2, sparse)
