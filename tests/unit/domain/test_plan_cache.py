"""Plan cache: one computation per distinct layer geometry within a transfer."""

from __future__ import annotations

import numpy as np
import pytest

from moriio.domain.kv.layout import LayerGeometry, LayerSpec, describe_layout
from moriio.domain.kv.plan_cache import PlanCache
from moriio.domain.kv.planner import plan_transfer

BF16 = 2
SPEC = LayerSpec(block_size=4, num_kv_heads=2, head_size=3)
MLA_SPEC = LayerSpec(block_size=4, num_kv_heads=1, head_size=3, kind="mla")


def dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def geometry(shape: tuple[int, ...], spec: LayerSpec = SPEC) -> LayerGeometry:
    return describe_layout(shape, dense(shape), BF16, spec)


def test_three_layers_with_two_geometries_compute_two_plans() -> None:
    dense0 = geometry((2, 8, 4, 2, 3))
    dense1 = geometry((2, 8, 4, 2, 3))  # another layer, same geometry
    indexer = geometry((8, 4, 3), MLA_SPEC)
    cache = PlanCache([1, 3], [4, 5], 16)

    plans = [cache.plan_for(g) for g in (dense0, dense1, indexer)]

    assert (cache.computations, cache.hits, len(cache)) == (2, 1, 2)
    assert plans[0] is plans[1]
    assert plans[2] is not plans[0]
    assert plans[0].to_lists() == ([48, 144, 432, 528], [192, 240, 960, 1008], [48] * 4)
    assert plans[2].to_lists() == ([24, 72], [96, 120], [24, 24])


def test_cached_plan_equals_a_direct_plan() -> None:
    g = geometry((8, 2, 4, 2, 3))
    cache = PlanCache([3, 4, 5, 0], [0, 1, 2, 7, 6], 16)
    assert (
        cache.plan_for(g).to_lists()
        == plan_transfer(g, [3, 4, 5, 0], [0, 1, 2, 7, 6], 16).to_lists()
    )


def test_same_shape_read_through_different_specs_gets_separate_entries() -> None:
    split = geometry((2, 16, 4, 2, 3), LayerSpec(8, 2, 3))  # kernel blocks of 4 in blocks of 8
    plain = geometry((2, 16, 4, 2, 3), LayerSpec(4, 2, 3))
    cache = PlanCache([1], [2], 16)
    a, b = cache.plan_for(split), cache.plan_for(plain)
    assert (cache.computations, len(cache)) == (2, 2)
    assert a.total_bytes == 2 * b.total_bytes


def test_the_cache_keeps_its_own_copy_of_numpy_ids() -> None:
    g = geometry((8, 4, 3), MLA_SPEC)
    local, remote = np.array([1, 2], dtype=np.int64), np.array([4, 5], dtype=np.int64)
    cache = PlanCache(local, remote, 16)
    local[:] = 7
    assert cache.plan_for(g).to_lists() == ([24], [96], [48])


def test_a_failed_plan_is_not_cached() -> None:
    small = geometry((8, 4, 3), MLA_SPEC)
    large = geometry((32, 4, 3), MLA_SPEC)
    cache = PlanCache([20], [4], 16)
    with pytest.raises(ValueError, match=r"local block id 20 is outside \[0, 8\)"):
        cache.plan_for(small)
    assert (cache.computations, len(cache)) == (0, 0)
    assert cache.plan_for(large).to_lists() == ([480], [96], [24])


@pytest.mark.parametrize(
    ("local", "remote", "rnb", "match"),
    [
        ([1], [4], 0, "remote_num_blocks"),
        ([1], [4], False, "remote_num_blocks"),
        ([1.5], [4], 16, "local block ids must be ints"),
        ([1], [None], 16, "remote block ids must be ints"),
    ],
)
def test_bad_transfer_inputs_fail_at_construction(
    local: list[object], remote: list[object], rnb: object, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        PlanCache(local, remote, rnb)  # type: ignore[arg-type]
