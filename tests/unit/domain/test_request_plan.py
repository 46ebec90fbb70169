"""The request planner: every layer's plan shifted to its place and merged by remote offset,
computed without sorting the whole batch where the layers' order already sorts it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moriio.domain.kv.descriptors import merged
from moriio.domain.kv.geometry import LayerSpec
from moriio.domain.kv.layout import describe_layout
from moriio.domain.kv.planner import plan_transfer
from moriio.domain.kv.request_plan import (
    Placement,
    RequestLayer,
    descriptors_and_posts,
    plan_request,
)

NB = 32


def _geometry(page: int, stride: int) -> object:
    spec = LayerSpec(block_size=1, num_kv_heads=1, head_size=None, content_bytes=page)
    return describe_layout((NB, 1, 1, page), (stride, page, page, 1), 1, spec)


def _reference(layers: list[RequestLayer], local: list[int], remote: list[int]) -> list[list[int]]:
    """Every layer planned alone, shifted, concatenated, sorted by remote offset, merged."""
    parts = [
        (plan_transfer(x.geometry, local, remote, NB), x.local, x.remote)  # type: ignore[arg-type]
        for x in layers
    ]
    lo = np.concatenate([p.local_offsets + a.offset for p, a, _ in parts])  # type: ignore[union-attr]
    ro = np.concatenate([p.remote_offsets + b.offset for p, _, b in parts])  # type: ignore[union-attr]
    sz = np.concatenate([p.sizes for p, _, _ in parts])
    return [a.tolist() for a in merged(lo, ro, sz)]


@settings(max_examples=200, deadline=None)
@given(
    num_layers=st.integers(1, 6),
    page=st.sampled_from([16, 48, 64]),
    block_outer=st.booleans(),
    pairs=st.lists(st.tuples(st.integers(0, NB - 1), st.integers(0, NB - 1)), max_size=12),
    order=st.randoms(use_true_random=False),
)
def test_the_merged_batch_is_the_reference_merge_of_every_layer(
    num_layers: int, page: int, block_outer: bool, pairs: list[tuple[int, int]], order: object
) -> None:
    local = list(dict.fromkeys(p[0] for p in pairs))
    remote = list(dict.fromkeys(p[1] for p in pairs))[: len(local)]
    local = local[: len(remote)]
    stride = page * num_layers if block_outer else page
    step = page if block_outer else NB * page
    geometry = _geometry(page, stride)
    slots = list(range(num_layers))
    order.shuffle(slots)  # type: ignore[attr-defined]  # layers listed in any order
    layers = [
        RequestLayer(f"l{i}", geometry, NB, None, Placement(0, i * step), Placement(0, i * step))
        for i in slots
    ]  # type: ignore[arg-type]
    (batch,) = plan_request(layers, local, remote)
    assert list(batch.plan.to_lists()) == _reference(layers, local, remote)
    if block_outer and local:
        runs = plan_transfer(geometry, local, remote, NB).num_descriptors  # type: ignore[arg-type]
        assert batch.plan.num_descriptors <= runs  # a row per block run, not per layer


def test_layers_of_different_geometries_merge_through_the_full_sort() -> None:
    small, large = _geometry(16, 16), _geometry(64, 64)
    layers = [
        RequestLayer("a", small, NB, None, Placement(0, 0), Placement(0, 0)),  # type: ignore[arg-type]
        RequestLayer("b", large, NB, None, Placement(0, NB * 16), Placement(0, NB * 16)),  # type: ignore[arg-type]
    ]
    local, remote = [3, 4, 9], [7, 8, 1]
    (batch,) = plan_request(layers, local, remote)
    assert list(batch.plan.to_lists()) == _reference(layers, local, remote)


def test_layers_without_a_span_on_either_side_post_alone() -> None:
    g = _geometry(16, 16)
    both = RequestLayer("both", g, NB, None, Placement(0, 0), Placement(1, 0))  # type: ignore[arg-type]
    mine = RequestLayer("mine", g, NB, None, Placement(0, 512), None)  # type: ignore[arg-type]
    theirs = RequestLayer("theirs", g, NB, None, None, Placement(1, 512))  # type: ignore[arg-type]
    batches = plan_request([mine, both, theirs], [1, 2], [5, 6])
    assert [(b.layers, b.local_span, b.remote_span) for b in batches] == [
        (("both",), 0, 1),
        (("mine",), None, None),
        (("theirs",), None, None),
    ]
    assert descriptors_and_posts(batches) == (3, 3)
    per_layer = plan_request([mine, both, theirs], [1, 2], [5, 6], by_span=False)
    assert [b.layers for b in per_layer] == [("mine",), ("both",), ("theirs",)]
    assert descriptors_and_posts(plan_request([both], [], [])) == (0, 0)


def test_a_placement_is_a_span_and_an_offset_never_negative() -> None:
    with pytest.raises(ValueError, match="span >= 0 and an offset >= 0"):
        Placement(0, -1)
