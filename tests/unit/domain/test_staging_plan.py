"""Staged fills: every byte of a batch crosses once, through fills no larger than the region."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moriio.domain.kv.planner import TransferPlan
from moriio.domain.kv.staging_plan import stage, stage_plan

SPACE = 1 << 12


def _apply_direct(source: np.ndarray, pieces: list[tuple[int, int, int]]) -> np.ndarray:
    out = np.zeros(SPACE, dtype=np.uint8)
    for s, d, n in pieces:
        out[d : d + n] = source[s : s + n]
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(1, 96), min_size=1, max_size=24),
    st.integers(1, 400),
    st.randoms(use_true_random=False),
)
def test_gather_fills_and_scatter_move_what_the_batch_moves(
    sizes: list[int], capacity: int, rng: object
) -> None:
    total = sum(sizes)
    # Disjoint destinations in random order; sources anywhere (they are only read).
    order = list(range(len(sizes)))
    rng.shuffle(order)  # type: ignore[attr-defined]
    dst_starts, at = [0] * len(sizes), 0
    for i in order:
        dst_starts[i], at = at, at + sizes[i] + 3
    src_starts = [rng.randrange(0, SPACE - n) for n in sizes]  # type: ignore[attr-defined]
    pieces = list(zip(src_starts, dst_starts, sizes, strict=True))
    source = np.random.default_rng(len(sizes)).integers(0, 256, SPACE, dtype=np.uint8)
    i64 = [np.array(v, dtype=np.int64) for v in (src_starts, dst_starts, sizes)]

    fills = stage(*i64, capacity)

    got = np.zeros(SPACE, dtype=np.uint8)
    assert len(fills) == -(-total // capacity)
    assert sum(f.length for f in fills) == total
    for fill in fills:
        assert 0 < fill.length <= capacity
        sender, receiver = np.zeros(capacity, np.uint8), np.zeros(capacity, np.uint8)
        g, s = fill.gather, fill.scatter
        assert int(g.sizes.sum()) == fill.length
        assert np.array_equal(g.dst, s.src)
        assert np.array_equal(g.sizes, s.sizes)
        assert int((g.dst + g.sizes).max()) <= capacity
        for a, b, n in zip(g.src.tolist(), g.dst.tolist(), g.sizes.tolist(), strict=True):
            sender[b : b + n] = source[a : a + n]
        receiver[: fill.length] = sender[: fill.length]  # the one descriptor of the fill
        for a, b, n in zip(s.src.tolist(), s.dst.tolist(), s.sizes.tolist(), strict=True):
            got[b : b + n] = receiver[a : a + n]
    assert np.array_equal(got, _apply_direct(source, pieces))


def test_a_read_gathers_on_the_peer_and_a_write_here() -> None:
    plan = TransferPlan(
        np.array([0, 100], dtype=np.int64),
        np.array([500, 700], dtype=np.int64),
        np.array([60, 60], dtype=np.int64),
    )
    (read,) = stage_plan(plan, 1 << 10, read=True)
    assert read.gather.src.tolist() == [500, 700]
    assert read.scatter.dst.tolist() == [0, 100]
    (write,) = stage_plan(plan, 1 << 10, read=False)
    assert write.gather.src.tolist() == [0, 100]
    assert write.scatter.dst.tolist() == [500, 700]
    assert write.gather.dst.tolist() == [0, 60]
    one, two = stage_plan(plan, 90, read=False)  # the second piece is cut at the fill's end
    assert (one.length, two.length) == (90, 30)
    assert one.gather.src.tolist() == [0, 100]
    assert one.gather.sizes.tolist() == [60, 30]
    assert two.gather.src.tolist() == [130]
    assert two.scatter.dst.tolist() == [730]


def test_an_empty_batch_stages_nothing_and_a_region_needs_bytes() -> None:
    empty = np.zeros(0, dtype=np.int64)
    assert stage(empty, empty, empty, 64) == ()
    with pytest.raises(ValueError, match="capacity of at least 1 byte"):
        stage(empty, empty, empty, 0)
