"""A request's blocks in several KV-cache groups: windows, the pairs that move, refusals."""

from __future__ import annotations

import pytest

from moriio.domain.kv.block_groups import (
    MISSING_BLOCK,
    announced_pairs,
    as_groups,
    movable_pairs,
    num_positions,
    window,
)
from moriio.domain.scheduler.consumer.book import ConsumerBook
from moriio.domain.values.modes import TransferMode
from support.read_params import read_params

# full attention, sliding window (positions 0-1 left the window), Mamba state (last position)
PREFILL = ((1, 2, 3, 4), (0, 0, 7, 8), (0, 0, 0, 9))
DECODE = ((11, 12, 13, 14), (0, 0, 17, 18), (0, 0, 0, 19))


def test_a_flat_list_is_one_group() -> None:
    assert as_groups([3, 4]) == ((3, 4),)
    assert as_groups([[3], [4, 5]]) == ((3,), (4, 5))
    assert as_groups([]) == ((),)
    assert num_positions(PREFILL) == 4


def test_a_window_cuts_every_group_at_the_same_positions_and_pads_short_ones() -> None:
    assert window(((1, 2, 3), (4,)), 1, 3, MISSING_BLOCK) == (2, 3, MISSING_BLOCK, MISSING_BLOCK)


def test_only_positions_both_sides_keep_move_and_a_freed_source_is_missing() -> None:
    dest, source = window(DECODE, 0, 4, 0), window(PREFILL, 0, 4, MISSING_BLOCK)
    assert movable_pairs(dest, source) == ((11, 12, 13, 14, 17, 18, 19), (1, 2, 3, 4, 7, 8, 9))
    freed = window(((1, 2, 3, 4), (0, 0, 0, 8), (0, 0, 0, 9)), 0, 4, MISSING_BLOCK)
    assert movable_pairs(dest, freed)[1] == (1, 2, 3, 4, MISSING_BLOCK, 8, 9)
    with pytest.raises(ValueError, match="differ in length"):
        movable_pairs((1, 2), (3,))


def test_a_push_pairs_the_announced_window_and_refuses_what_it_cannot_fill() -> None:
    announced = window(DECODE, 2, 4, 0)  # the first two positions were local prefix hits
    assert announced_pairs(PREFILL, announced, 2) == ((3, 4, 7, 8, 9), (13, 14, 17, 18, 19))
    with pytest.raises(ValueError, match="not a window of the producer's 3 KV-cache group"):
        announced_pairs(PREFILL, announced[:-1], 2)
    with pytest.raises(ValueError, match=r"producer holds \[4, 4, 4\]"):
        announced_pairs(PREFILL, (*window(DECODE, 3, 5, 0), 0, 0, 0), 3)
    assert announced_pairs(((5, 6),), (8, 9), 0) == ((5, 6), (8, 9))  # one group, as before


@pytest.mark.parametrize("mode", [TransferMode.READ, TransferMode.WRITE])
def test_with_recurrent_state_the_decode_computes_the_last_prompt_token(mode: TransferMode) -> None:
    params = read_params(PREFILL)
    assert ConsumerBook(mode, 16, prefill_backoff=1).match("r", params, 64, 0).num_tokens == 63
    plain = ConsumerBook(mode, 16).match("r", params, 64, 0).num_tokens
    assert plain == 64


def test_the_consumer_reads_every_groups_kept_blocks_and_announces_its_whole_window() -> None:
    read = ConsumerBook(TransferMode.READ, 16)
    params = read_params(PREFILL)
    assert read.on_allocated("r", params, DECODE, 64)
    (order,) = read.take_orders().reads
    assert order.local_block_ids == (11, 12, 13, 14, 17, 18, 19)
    assert order.remote_block_ids == (1, 2, 3, 4, 7, 8, 9)
    write = ConsumerBook(TransferMode.WRITE, 16)
    write.match("r", params, 64, 32)
    assert write.on_allocated("r", params, DECODE, 32)
    (expect,) = write.take_orders().expect_writes
    assert (expect.local_block_ids, expect.first_block) == ((13, 14, 17, 18, 0, 19), 2)
