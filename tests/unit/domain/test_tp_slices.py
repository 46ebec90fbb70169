"""The TP sharding arithmetic, slice layouts on the wire, and the checks that refuse shards
which would not line up."""

from __future__ import annotations

import itertools

import pytest

from moriio.domain.kv.head_slices import SliceLayout, UnitPlane, Unsliceable, check_slices
from moriio.domain.kv.shards import (
    UnevenShardsError,
    consumer_group,
    moved_units,
    producer_group,
    rank_units,
    ranks_covered,
)
from moriio.domain.params.share_ids import share_transfer_id
from moriio.domain.params.transfer_params import MAX_TRANSFER_ID_LEN
from moriio.domain.protocol.handshake import LayerRegions
from moriio.domain.protocol.tp_layers import check_sliced_layers


@pytest.mark.parametrize(
    ("total", "tp", "ranges"),
    [(8, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]), (2, 4, [(0, 1), (0, 1), (1, 2), (1, 2)])],
)
def test_rank_units_follow_vllms_sharding(
    total: int, tp: int, ranges: list[tuple[int, int]]
) -> None:
    assert [(r.start, r.stop) for r in (rank_units(i, tp, total) for i in range(tp))] == ranges


@pytest.mark.parametrize(("total", "tp"), [(6, 4), (4, 6), (3, 2)])
def test_units_that_do_not_shard_evenly_are_refused(total: int, tp: int) -> None:
    with pytest.raises(UnevenShardsError, match=f"{total} units do not split evenly over TP {tp}"):
        rank_units(0, tp, total)


@pytest.mark.parametrize(
    ("total", "producer_tp", "consumer_tp"),
    [
        (t, p, c)
        for t, p, c in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8))
        if (p <= t or p % t == 0) and (c <= t or c % t == 0)
    ],
)
def test_every_unit_a_consumer_rank_holds_arrives_once(
    total: int, producer_tp: int, consumer_tp: int
) -> None:
    for c in range(consumer_tp):
        got: list[int] = []
        for p in producer_group(c, consumer_tp, producer_tp):
            got += list(moved_units(total, p, producer_tp, c, consumer_tp))
            assert c in consumer_group(p, producer_tp, consumer_tp)
        assert sorted(got) == list(rank_units(c, consumer_tp, total))


def test_sizes_that_do_not_pair_cover_every_producer_rank_once() -> None:
    covered = [r for c in range(3) for r in ranks_covered(c, 3, 2)]
    assert sorted(covered) == [0, 1]
    covered = [r for c in range(2) for r in ranks_covered(c, 2, 5)]
    assert sorted(covered) == [0, 1, 2, 3, 4]


def _layout(units: int = 2, total: int = 4, row_bytes: int = 64, rows: int = 16) -> SliceLayout:
    plane = UnitPlane(0, rows * row_bytes, row_bytes, rows, row_bytes, total)
    return SliceLayout((plane, plane), (units, units))


def test_a_slice_layout_crosses_the_wire_and_bad_ints_are_refused() -> None:
    layout = _layout()
    assert SliceLayout.from_wire(layout.to_wire()) == layout
    with pytest.raises(ValueError, match="7 ints per plane"):
        SliceLayout.from_wire((1, 2, 3))
    with pytest.raises(ValueError, match="holds 5 of 4 units"):
        SliceLayout.from_wire((5, 0, 64, 64, 1, 64, 4))
    with pytest.raises(ValueError, match="rows must be a positive int"):
        LayerRegions("l", (b"d",), 8, 1024, 1024, slices=((1, 0, 64, 64, 0, 64, 4),))


def test_shards_that_would_not_line_up_are_named() -> None:
    with pytest.raises(ValueError, match="plane 0: row_bytes differs \\(ours=64, theirs=32\\)"):
        check_slices(_layout(), _layout(units=4, row_bytes=32), 2, 1)
    with pytest.raises(ValueError, match="lie in 2 planes here and 1 there"):
        check_slices(_layout(), SliceLayout(_layout().planes[:1], (4,)), 2, 1)
    with pytest.raises(ValueError, match="theirs holds 2 of 4 units, not the 4 TP 1 gives"):
        check_slices(_layout(), _layout(), 2, 1)
    with pytest.raises(UnevenShardsError, match="4 KV heads \\(plane 0\\) do not split evenly"):
        check_slices(_layout(units=1), _layout(units=1), 4, 3)


def test_layers_check_names_the_layer_and_group() -> None:
    ours = {"attn": ((_layout(units=4),), 4096)}
    theirs = [
        LayerRegions("attn", (b"d",), 8, 2048, 2048, slices=(_layout(row_bytes=32).to_wire(),))
    ]
    with pytest.raises(ValueError, match="layer 'attn', group 0: KV heads, plane 0: row_bytes"):
        check_sliced_layers(ours, theirs, 1, 2, total_kv_heads=4, is_mla=False)
    whole = [LayerRegions("attn", (b"d",), 8, 2048, 2048)]
    with pytest.raises(ValueError, match="layer 'attn', group 0: the peer moves only whole"):
        check_sliced_layers(ours, whole, 1, 2, total_kv_heads=4, is_mla=False)
    unsliceable = {"attn": ((Unsliceable("backend X folds heads"),), 4096)}
    with pytest.raises(ValueError, match="cannot be sliced between TP sizes: backend X folds"):
        check_sliced_layers(unsliceable, whole, 1, 2, total_kv_heads=4, is_mla=False)
    # MLA (every rank holds the latent): whole pages of one length
    check_sliced_layers({"attn": ((None,), 2048)}, whole, 1, 2, total_kv_heads=1, is_mla=True)
    with pytest.raises(ValueError, match="multiple of each other"):
        check_sliced_layers(ours, whole, 2, 3, total_kv_heads=6, is_mla=False)
    no_facts = {"attn": ((), 2048)}  # a core that says nothing of its shards: replicated only
    with pytest.raises(ValueError, match="layer 'attn': TP 1 <-> 2 with 4 KV heads would split"):
        check_sliced_layers(no_facts, whole, 1, 2, total_kv_heads=4, is_mla=False)


def test_share_ids_name_each_consumer_rank_of_a_producer_rank() -> None:
    assert share_transfer_id("tx", 0, 1) == "tx"
    assert [share_transfer_id("tx", k, 2) for k in range(2)] == ["tx#share0", "tx#share1"]
    long = "x" * MAX_TRANSFER_ID_LEN
    assert len(share_transfer_id(long, 1, 2)) <= MAX_TRANSFER_ID_LEN
    with pytest.raises(ValueError, match="share index"):
        share_transfer_id("tx", 2, 2)
