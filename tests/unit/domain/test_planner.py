"""Transfer planner: pinned offsets, coalescing, input rules, and byte-exact coverage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moriio.domain.kv.layout import LayerGeometry, LayerSpec, LayoutKind, describe_layout
from moriio.domain.kv.planner import TransferPlan, plan_transfer, plan_transfer_naive

BF16 = 2
SPEC = LayerSpec(block_size=4, num_kv_heads=2, head_size=3)


def dense(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def geometry(shape: tuple[int, ...], spec: LayerSpec = SPEC) -> LayerGeometry:
    return describe_layout(shape, dense(shape), BF16, spec)


# -- worked examples: bf16, bs=4, H=2, D=3; local [1, 3] -> remote [4, 5]; remote nb=16 -----

WORKED = [
    ((2, 8, 4, 2, 3), SPEC, ([48, 144, 432, 528], [192, 240, 960, 1008], [48] * 4)),
    ((2, 8, 2, 4, 3), SPEC, ([48, 144, 432, 528], [192, 240, 960, 1008], [48] * 4)),
    ((8, 2, 4, 2, 3), SPEC, ([96, 288], [384, 480], [96, 96])),
    ((8, 2, 2, 4, 3), SPEC, ([96, 288], [384, 480], [96, 96])),
    ((8, 4, 3), LayerSpec(4, 1, 3, "mla"), ([24, 72], [96, 120], [24, 24])),
]


@pytest.mark.parametrize(
    ("shape", "spec", "expected"),
    WORKED,
    ids=["separated", "separated-HND", "interleaved", "interleaved-HND", "mla"],
)
def test_worked_examples(
    shape: tuple[int, ...], spec: LayerSpec, expected: tuple[list[int], ...]
) -> None:
    g = geometry(shape, spec)
    plan = plan_transfer(g, [1, 3], [4, 5], 16)
    assert plan.to_lists() == expected
    assert plan_transfer_naive(g, [1, 3], [4, 5], 16) == expected
    assert plan.num_descriptors == len(expected[2])
    assert plan.total_bytes == sum(expected[2])


def test_mixed_layouts_give_distinct_plans() -> None:
    plans = {
        shape: plan_transfer(geometry(shape, spec), [1, 3], [4, 5], 16) for shape, spec, _ in WORKED
    }
    assert len({tuple(map(tuple, p.to_lists())) for p in plans.values()}) == 3


def test_separated_kernel_block_offsets() -> None:
    g = geometry((2, 16, 4, 2, 3), LayerSpec(8, 2, 3))
    plan = plan_transfer(g, [1, 3], [4, 5], 16)
    assert plan.to_lists() == (
        [96, 288, 768 + 96, 768 + 288],
        [384, 480, 1536 + 384, 1536 + 480],
        [96] * 4,
    )


def test_interleaved_kernel_block_offsets() -> None:
    g = geometry((16, 2, 4, 2, 3), LayerSpec(8, 2, 3))
    assert plan_transfer(g, [1, 3], [4, 5], 16).to_lists() == ([192, 576], [768, 960], [192, 192])


def test_packed_cpu_pages_coalesce_into_one_descriptor() -> None:
    g = describe_layout((8192, 2, 32, 128), (8192, 4096, 128, 1), 4, LayerSpec(32, 2, 64))
    plan = plan_transfer(g, [0, 1, 2], [5, 6, 7], 8192)
    assert plan.to_lists() == ([0], [5 * 32768], [3 * 32768])


# -- coalescing --------------------------------------------------------------------------


def test_consecutive_blocks_merge_into_one_descriptor_per_half() -> None:
    g = geometry((2, 8, 4, 2, 3))
    plan = plan_transfer(g, [0, 1, 2], [5, 6, 7], 16)
    assert plan.to_lists() == ([0, 384], [240, 768 + 240], [144, 144])


def test_descending_runs_merge_too() -> None:
    g = geometry((2, 8, 4, 2, 3))
    plan = plan_transfer(g, [2, 1, 0], [7, 6, 5], 16)
    assert plan.to_lists() == ([0, 384], [240, 768 + 240], [144, 144])


def test_runs_break_where_either_side_jumps() -> None:
    g = geometry((8, 4, 3), LayerSpec(4, 1, 3, "mla"))
    plan = plan_transfer(g, [0, 1, 2, 3, 5], [5, 6, 9, 10, 11], 16)
    assert plan.to_lists() == ([0, 48, 120], [120, 216, 264], [48, 48, 24])
    assert plan.total_bytes == 5 * 24


def test_a_run_never_turns_back() -> None:
    g = geometry((8, 4, 3), LayerSpec(4, 1, 3, "mla"))
    plan = plan_transfer(g, [1, 2, 1], [5, 6, 5], 16)
    assert plan.to_lists() == ([24, 24], [120, 120], [48, 24])


def test_interleaved_blocks_merge_k_and_v_and_neighbours() -> None:
    g = geometry((8, 2, 4, 2, 3))
    assert plan_transfer(g, [3, 4, 5], [0, 1, 2], 16).to_lists() == ([288], [0], [288])


def test_padded_blocks_never_merge_across_blocks() -> None:
    g = describe_layout((2, 8, 4, 2, 3), (240, 30, 6, 3, 1), BF16, SPEC)
    plan = plan_transfer(g, [1, 2], [4, 5], 16)
    assert plan.to_lists() == (
        [60, 120, 480 + 60, 480 + 120],
        [240, 300, 960 + 240, 960 + 300],
        [48] * 4,
    )


def test_interleaved_with_a_gap_between_k_and_v_moves_them_apart() -> None:
    g = describe_layout((8, 2, 4, 2, 3), (50, 25, 6, 3, 1), BF16, SPEC)
    plan = plan_transfer(g, [1, 2], [3, 4], 16)
    assert plan.to_lists() == ([100, 200, 150, 250], [300, 400, 350, 450], [48] * 4)


# -- input rules -------------------------------------------------------------------------

G = geometry((2, 8, 4, 2, 3))


def test_longer_local_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="3 local block ids but only 2 remote"):
        plan_transfer(G, [0, 1, 2], [4, 5], 16)


def test_shorter_local_list_transfers_the_paired_prefix() -> None:
    assert plan_transfer(G, [1], [4, 5, 6], 16).to_lists() == ([48, 432], [192, 960], [48, 48])


def test_empty_local_list_is_an_empty_plan() -> None:
    plan = plan_transfer(G, [], [4, 5], 16)
    assert (plan.num_descriptors, plan.total_bytes) == (0, 0)
    assert plan.local_offsets.dtype == np.int64
    assert plan_transfer(G, [], [], 16).to_lists() == ([], [], [])


@pytest.mark.parametrize(
    ("local", "remote", "match"),
    [
        ([1, 8], [4, 5], r"local block id 8 is outside \[0, 8\)"),
        ([-1, 2], [4, 5], r"the local side holds no block"),
        ([1, 2], [4, 16], r"remote block id 16 is outside \[0, 16\)"),
        ([1, 2], [-3, 5], r"remote block id -3 is outside"),
        ([1], [4, 99], r"remote block id 99"),
        ([], [99], r"remote block id 99"),
    ],
)
def test_out_of_range_ids_are_rejected_by_name(
    local: list[int], remote: list[int], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        plan_transfer(G, local, remote, 16)
    with pytest.raises(ValueError, match=match):
        plan_transfer(G, np.array(local, dtype=np.int64), np.array(remote, dtype=np.int32), 16)


@pytest.mark.parametrize(
    ("local", "remote", "rnb", "match"),
    [
        ([1.5], [4], 16, "local block ids must be ints"),
        ([1], ["4"], 16, "remote block ids must be ints"),
        ([2**64], [4], 16, "local block ids must be ints"),
        (np.zeros((1, 1), dtype=np.int64), [4], 16, "1-D integer array"),
        (np.array([1.0]), [4], 16, "1-D integer array"),
        ([1], [4], 0, "remote_num_blocks must be a positive int"),
        ([1], [4], True, "remote_num_blocks must be a positive int"),
        ([1], [4], 16.0, "remote_num_blocks must be a positive int"),
    ],
)
def test_malformed_inputs_are_rejected(
    local: object, remote: object, rnb: object, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        plan_transfer(G, local, remote, rnb)  # type: ignore[arg-type]


def test_numpy_inputs_match_list_inputs_and_are_left_untouched() -> None:
    local = np.array([3, 1, 2], dtype=np.int32)
    remote = np.array([9, 4, 5, 6], dtype=np.uint16)
    plan = plan_transfer(G, local, remote, np.int64(16))  # type: ignore[arg-type]
    assert plan.to_lists() == plan_transfer(G, [3, 1, 2], [9, 4, 5, 6], 16).to_lists()
    assert local.tolist() == [3, 1, 2]
    assert local.flags.writeable


def test_plan_is_read_only_int64() -> None:
    plan = plan_transfer(G, [1, 3], [4, 5], 16)
    for array in (plan.local_offsets, plan.remote_offsets, plan.sizes):
        assert array.dtype == np.int64
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 7


def test_transfer_plan_validates_its_arrays() -> None:
    a = np.zeros(2, dtype=np.int64)
    with pytest.raises(ValueError, match="equal length"):
        TransferPlan(a, np.zeros(3, dtype=np.int64), a.copy())
    with pytest.raises(ValueError, match="int64"):
        TransferPlan(a, a.copy(), np.zeros(2, dtype=np.int32))


# -- property: a plan moves exactly the bytes of the per-block enumeration -------------------

Ids = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Case:
    kind: LayoutKind
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    remote_shape: tuple[int, ...]
    remote_strides: tuple[int, ...]
    itemsize: int
    spec: LayerSpec
    k: int  # kernel blocks per logical block
    block_axis: int


def _page_strides(sizes: tuple[int, ...], order: list[int]) -> list[int]:
    """Dense strides for ``sizes`` nested in ``order`` (outermost first)."""
    strides = [0] * len(sizes)
    step = 1
    for dim in reversed(order):
        strides[dim] = step
        step *= sizes[dim]
    return strides


@st.composite
def cases(draw: st.DrawFn) -> Case:
    kind = draw(st.sampled_from(["mla", "packed", "sep", "inter", "ksep", "kblocks"]))
    itemsize = draw(st.sampled_from([1, 2, 4]))
    nb, rnb = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    heads, dim, bs = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    k = draw(st.integers(2, 3)) if kind in ("ksep", "kblocks") else 1
    pad = 0 if k > 1 else draw(st.integers(0, 5))
    if kind == "mla":
        page_sizes: tuple[int, ...] = (bs, dim)
        spec = LayerSpec(bs, 1, dim, "mla")
    elif kind == "packed":
        page_sizes = (heads, bs, 2 * dim)
        spec = LayerSpec(bs, heads, dim)
    else:
        page_sizes = (bs, heads, dim) if draw(st.booleans()) else (heads, bs, dim)
        spec = LayerSpec(bs * k, heads, dim)
    order = draw(st.permutations(range(len(page_sizes))))
    page = int(np.prod(page_sizes))
    inner = _page_strides(page_sizes, list(order))
    if kind in ("mla", "packed"):
        shape, remote_shape = (nb, *page_sizes), (rnb, *page_sizes)
        strides = remote_strides = (page + pad, *inner)
        return Case(LayoutKind(kind), shape, strides, remote_shape, strides, itemsize, spec, 1, 0)
    nk, rnk = nb * k, rnb * k
    if kind in ("sep", "ksep"):
        block = page + pad
        kv_gap = draw(st.integers(0, 4))
        shape, remote_shape = (2, nk, *page_sizes), (2, rnk, *page_sizes)
        strides = (nk * block + kv_gap, block, *inner)
        remote_strides = (rnk * block, block, *inner)
        return Case(
            LayoutKind.SEPARATED, shape, strides, remote_shape, remote_strides, itemsize, spec, k, 1
        )
    if nk == 2:  # [2, 2, ...] reads as separated
        nb += 1
        nk = nb * k
    kv_gap = 0 if k > 1 else draw(st.integers(0, 3))
    strides = (2 * page + kv_gap + pad, page + kv_gap, *inner)
    shape, remote_shape = (nk, 2, *page_sizes), (rnk, 2, *page_sizes)
    expected = LayoutKind.INTERLEAVED if k == 1 else LayoutKind.KERNEL_BLOCKS
    return Case(expected, shape, strides, remote_shape, strides, itemsize, spec, k, 0)


def _element_offsets(shape: tuple[int, ...], strides: tuple[int, ...]) -> Ids:
    offsets = np.zeros(shape, dtype=np.int64)
    for dim, (size, stride) in enumerate(zip(shape, strides, strict=True)):
        index_shape = [1] * len(shape)
        index_shape[dim] = size
        offsets += (np.arange(size, dtype=np.int64) * stride).reshape(index_shape)
    return offsets


def _block_bytes(offsets: Ids, case: Case, block: int) -> Ids:
    """Bytes of one logical block in logical element order (the naive enumeration)."""
    kernel = slice(block * case.k, (block + 1) * case.k)
    elements = offsets[:, kernel] if case.block_axis == 1 else offsets[kernel]
    flat = elements.ravel()
    return (flat[:, None] * case.itemsize + np.arange(case.itemsize)).ravel()


def _expected_pairs(case: Case, local: list[int], remote: list[int]) -> tuple[Ids, Ids]:
    loc = _element_offsets(case.shape, case.strides)
    rem = _element_offsets(case.remote_shape, case.remote_strides)
    pairs = list(zip(local, remote, strict=False))
    if not pairs:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lb = np.concatenate([_block_bytes(loc, case, b) for b, _ in pairs])
    rb = np.concatenate([_block_bytes(rem, case, b) for _, b in pairs])
    order = np.argsort(lb, kind="stable")
    return lb[order], rb[order]


def _covered_pairs(local_offsets: Ids, remote_offsets: Ids, sizes: Ids) -> tuple[Ids, Ids]:
    lo, ro, sz = (np.asarray(a, dtype=np.int64) for a in (local_offsets, remote_offsets, sizes))
    rel = np.arange(int(sz.sum()), dtype=np.int64) - np.repeat(np.cumsum(sz) - sz, sz)
    lb = np.repeat(lo, sz) + rel
    rb = np.repeat(ro, sz) + rel
    order = np.argsort(lb, kind="stable")
    return lb[order], rb[order]


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> int:
    return itemsize * (1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)))


@st.composite
def id_lists(draw: st.DrawFn, nb: int, rnb: int) -> tuple[list[int], list[int]]:
    def arrange(ids: list[int]) -> list[int]:
        mode = draw(st.sampled_from(["as drawn", "ascending", "descending"]))
        return ids if mode == "as drawn" else sorted(ids, reverse=mode == "descending")

    n = draw(st.integers(0, min(nb, rnb)))
    local = arrange(draw(st.permutations(range(nb)))[:n])
    extra = draw(st.integers(0, rnb - n))
    remote = arrange(draw(st.permutations(range(rnb)))[: n + extra])
    return local, remote


@settings(max_examples=300, deadline=None)
@given(data=st.data(), case=cases())
def test_plan_covers_exactly_the_per_block_byte_pairs(data: st.DataObject, case: Case) -> None:
    nb, rnb = case.shape[case.block_axis] // case.k, case.remote_shape[case.block_axis] // case.k
    local, remote = data.draw(id_lists(nb, rnb))
    g = describe_layout(case.shape, case.strides, case.itemsize, case.spec)
    assert g.kind is case.kind
    assert (g.num_blocks, g.kernel_blocks_per_block) == (nb, case.k)
    assert g.region_len == _extent(case.shape, case.strides, case.itemsize)

    plan = plan_transfer(g, local, remote, rnb)
    want_local, want_remote = _expected_pairs(case, local, remote)
    got_local, got_remote = _covered_pairs(plan.local_offsets, plan.remote_offsets, plan.sizes)
    np.testing.assert_array_equal(got_local, want_local)
    np.testing.assert_array_equal(got_remote, want_remote)
    assert plan.total_bytes == len(local) * g.transfers_per_block * g.block_len
    assert plan.num_descriptors <= len(local) * g.transfers_per_block
    assert bool((plan.sizes > 0).all())
    if plan.num_descriptors:
        assert int((plan.local_offsets + plan.sizes).max()) <= g.region_len
        remote_len = _extent(case.remote_shape, case.remote_strides, case.itemsize)
        assert int((plan.remote_offsets + plan.sizes).max()) <= remote_len

    naive = plan_transfer_naive(g, local, remote, rnb)
    naive_local, naive_remote = _covered_pairs(*(np.array(a, dtype=np.int64) for a in naive))
    np.testing.assert_array_equal(naive_local, want_local)
    np.testing.assert_array_equal(naive_remote, want_remote)
    # Same descriptors for ascending ids, except where the naive sort interleaves K and V
    # pieces differently (SEPARATED halves, interleaved K/V with a gap between them).
    split_kv = g.transfers_per_block == 2 and g.v_offset_bytes != g.block_len
    if local == sorted(local) and g.kind is not LayoutKind.SEPARATED and not split_kv:
        assert plan.to_lists() == naive
