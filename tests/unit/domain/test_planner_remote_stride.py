"""A peer whose blocks sit a different stride apart is addressed with its own stride."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from moriio.domain.kv.layout import LayerSpec, LayoutKind, describe_layout
from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.planner import plan_transfer, plan_transfer_naive

PAGE = LayerSpec(block_size=4, num_kv_heads=2, head_size=3)  # a [nb, 2, 4, 6] page view
ELEMENTS = 2 * 4 * 6


def _pieces(plan: tuple[list[int], list[int], list[int]]) -> set[tuple[int, int]]:
    """Every (local byte, remote byte) pair a plan copies."""
    return {(lo + i, ro + i) for lo, ro, size in zip(*plan, strict=True) for i in range(size)}


@settings(max_examples=200, deadline=None)
@given(
    layout=st.sampled_from(["page", "planes"]),
    pad=st.integers(min_value=0, max_value=40),
    ids=st.lists(st.integers(0, 5), min_size=1, max_size=6, unique=True),
    data=st.data(),
)
def test_remote_offsets_use_the_peer_s_own_block_stride(
    layout: str, pad: int, ids: list[int], data: st.DataObject
) -> None:
    if layout == "page":  # one chunk per block
        g = describe_layout((6, 2, 4, 6), (ELEMENTS, 24, 6, 1), 2, PAGE)
    else:  # K plane and V plane ([L, H, B, N, C]): two chunks per block
        g = describe_layout((6, 2, 4, 6), (24, 6 * 24, 6, 1), 2, PAGE)
        assert g.kind is LayoutKind.SEPARATED
    remote_ids = data.draw(st.permutations(range(8)))[: len(ids)]
    stride = g.block_stride_bytes + 2 * pad
    plan = plan_transfer(g, ids, remote_ids, 8, stride).to_lists()
    naive = plan_transfer_naive(g, ids, remote_ids, 8, stride)
    assert _pieces(plan) == _pieces(naive)
    want = set()
    for local, remote in zip(ids, remote_ids, strict=True):
        for half in range(g.transfers_per_block):
            lo = local * g.block_stride_bytes + half * g.v_offset_bytes
            ro = remote * stride + half * 8 * stride
            want |= {(lo + i, ro + i) for i in range(g.block_len)}
    assert _pieces(plan) == want


def test_plans_for_different_peer_strides_are_cached_apart() -> None:
    g = describe_layout((6, 2, 4, 6), (ELEMENTS, 24, 6, 1), 2, PAGE)
    cache = PlanCache([0, 1], [2, 3], 8)
    own, padded = cache.plan_for(g), cache.plan_for(g, 2 * g.block_stride_bytes)
    assert own.to_lists() == ([0], [2 * g.block_len], [2 * g.block_len])  # coalesced
    assert padded.to_lists()[1] == [4 * g.block_len, 6 * g.block_len]  # not coalesced
    assert cache.plan_for(g, 2 * g.block_stride_bytes) is padded
    assert (cache.computations, cache.hits) == (2, 1)
