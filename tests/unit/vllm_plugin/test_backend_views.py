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

from moriio.adapters.device.copier import DeviceCopier
from moriio.domain.kv.layout import LayerGeometry, LayoutKind, describe_layout
from moriio.domain.kv.planner import plan_transfer
from moriio.domain.kv.request_plan import Placement, RequestLayer, plan_request
from moriio.domain.kv.staging_plan import Segments, stage_plan
from moriio.testing.fake_stream import FakeCopyStream, FakeStream
from moriio.vllm_plugin.kv_views import to_layer_spec
from support.kv_views import BF16, LOCAL_BLOCKS, REMOTE_BLOCKS, ROWS, Row, attn, mla
from support.kv_views import views as build_views

L = KVCacheLayout


def _triple(segments: Segments) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return segments.src, segments.dst, segments.sizes


def _geometry(spec: KVCacheSpec, view: torch.Tensor) -> LayerGeometry:
    return describe_layout(
        tuple(view.shape), tuple(view.stride()), view.element_size(), to_layer_spec(spec)
    )


def _bytes(view: torch.Tensor) -> torch.Tensor:
    return view.view(torch.uint8)


MOVERS = ["descriptors", "device copies", "request in one launch", "request on a fake device"]


@pytest.mark.parametrize("mover", MOVERS)
@pytest.mark.parametrize("name", list(ROWS))
def test_every_backend_view_is_planned_and_moved_like_a_naive_per_block_copy(
    name: str, mover: str
) -> None:
    """``device copies``: each layer's plan as one batch of rows over the whole buffer;
    ``request in one launch``: every layer's plan (K/V halves included) as one batch;
    ``... on a fake device``: the same batch queued on a copier stream that runs later."""
    row = ROWS[name]
    device = FakeStream(1)
    stream = FakeCopyStream(device, 1) if mover.endswith("fake device") else None
    copier = DeviceCopier(torch.device("cpu"), memcpy_descriptors=0, stream=stream)
    local_raw, local_views = build_views(row, LOCAL_BLOCKS)
    remote_raw, remote_views = build_views(row, REMOTE_BLOCKS)
    expected_raw, expected_views = build_views(row, LOCAL_BLOCKS, local_raw.clone())
    got = local_raw.clone().view(torch.uint8).numpy()
    src = remote_raw.view(torch.uint8).numpy()
    pairs = [(4, 8), (0, 2), (5, 0), (1, 1)]
    batch: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
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
        offsets = (plan.local_offsets + base_local, plan.remote_offsets + base_remote)
        batch.append((offsets[0], offsets[1], plan.sizes))
        if mover == "device copies":
            copier.copy(torch.from_numpy(got), torch.from_numpy(src), *batch[-1])
        for lo, ro, size in zip(*plan.to_lists(), strict=True):
            if mover == "descriptors":
                got[base_local + lo : base_local + lo + size] = src[
                    base_remote + ro : base_remote + ro + size
                ]
        for lb, rb in pairs:
            _bytes(naive)[lb * k : (lb + 1) * k] = _bytes(remote)[rb * k : (rb + 1) * k]
    if mover.startswith("request"):
        whole = [np.concatenate(side) for side in zip(*batch, strict=True)]
        done = copier.copy(torch.from_numpy(got), torch.from_numpy(src), *whole)
        assert copier.batches == 1
        assert copier.kernels <= 2 or len(whole[2]) <= copier.memcpy_descriptors
        assert device.run()
        assert done.query()
    assert np.array_equal(got, expected_raw.view(torch.uint8).numpy()), name
    assert not np.array_equal(got, local_raw.view(torch.uint8).numpy())


@pytest.mark.parametrize("staging", [0, 1000])
@pytest.mark.parametrize("name", list(ROWS))
def test_every_backend_view_moves_in_one_request_batch_like_a_naive_per_block_copy(
    name: str, staging: int
) -> None:
    """Every layer of the request in one batch against each side's whole buffer (a span):
    the same bytes as the per-block copy; a block-outer page order merges each block's
    pages of every layer into one descriptor. ``staging``: the batch goes through staging
    regions of that many bytes (gather, one descriptor per fill, scatter)."""
    row = ROWS[name]
    local_raw, local_views = build_views(row, LOCAL_BLOCKS)
    remote_raw, remote_views = build_views(row, REMOTE_BLOCKS)
    expected_raw, expected_views = build_views(row, LOCAL_BLOCKS, local_raw.clone())
    pairs = [(4, 8), (0, 2), (5, 0), (1, 1)]
    layers, per_layer = [], 0
    views = zip(local_views, remote_views, expected_views, strict=True)
    for i, ((spec, local), (_, remote), (_, naive)) in enumerate(views):
        mine, theirs = _geometry(spec, local), _geometry(spec, remote)
        here = Placement(0, local.data_ptr() - local_raw.data_ptr())
        there = Placement(0, remote.data_ptr() - remote_raw.data_ptr())
        layers.append(
            RequestLayer(
                f"layer{i}", mine, theirs.num_blocks, theirs.block_stride_bytes, here, there
            )
        )
        per_layer += len(pairs) * mine.transfers_per_block
        k = mine.kernel_blocks_per_block
        for lb, rb in pairs:
            _bytes(naive)[lb * k : (lb + 1) * k] = _bytes(remote)[rb * k : (rb + 1) * k]
    local_ids, remote_ids = [p[0] for p in pairs], [p[1] for p in pairs]
    (batch,) = plan_request(layers, local_ids, remote_ids)
    assert batch.layers == tuple(layer.name for layer in layers)
    got = local_raw.clone().view(torch.uint8).numpy()
    src = remote_raw.view(torch.uint8).numpy()
    if staging:  # READ: the peer gathers, its staging crosses whole, we scatter
        theirs_staged, ours_staged = np.zeros(staging, np.uint8), np.zeros(staging, np.uint8)
        for fill in stage_plan(batch.plan, staging, read=True):
            for s, d, n in zip(*(a.tolist() for a in _triple(fill.gather)), strict=True):
                theirs_staged[d : d + n] = src[s : s + n]
            ours_staged[: fill.length] = theirs_staged[: fill.length]
            for s, d, n in zip(*(a.tolist() for a in _triple(fill.scatter)), strict=True):
                got[d : d + n] = ours_staged[s : s + n]
    for lo, ro, size in zip(*batch.plan.to_lists(), strict=True):
        if not staging:
            got[lo : lo + size] = src[ro : ro + size]
    assert np.array_equal(got, expected_raw.view(torch.uint8).numpy()), name
    if row.layout.is_block_outermost:
        assert batch.plan.num_descriptors == len(pairs)  # a block's pages of every layer
    else:
        assert batch.plan.num_descriptors <= per_layer


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
