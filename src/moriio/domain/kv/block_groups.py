"""A request's blocks in each KV-cache group, and which pairs of them a transfer moves.

vLLM's hybrid KV-cache manager gives a request one block list per KV-cache group (full
attention, sliding window, Mamba / linear-attention state). The groups share one block pool
and one page size, and each KV tensor holds one layer of every group, so a block id names
the same page in every tensor whatever group owns it. A transfer therefore pairs, group by
group, the producer's and the consumer's blocks at the same positions (position ``i`` holds
tokens ``i * block_size ..``), then moves every pair in every tensor.

Positions a group keeps no KV for hold the null block (id 0, which vLLM never gives a
request): a sliding-window group's positions before the window, a Mamba group's positions
but the one holding the state. Nothing is moved into or out of the null block. A position
the consumer needs but the producer no longer holds becomes :data:`MISSING_BLOCK`, which the
planner refuses by name (the load fails; corrupt KV never reaches attention).

Without the hybrid manager there is one group and every position holds a real block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

NULL_BLOCK = 0  # vLLM's null block: a placeholder that holds no KV
MISSING_BLOCK = -1  # a position past the end of a group's list

BlockGroups: TypeAlias = tuple[tuple[int, ...], ...]
AnyBlockIds: TypeAlias = Sequence[int] | Sequence[Sequence[int]]  # flat: a single group


def as_groups(block_ids: AnyBlockIds) -> BlockGroups:
    """``block_ids`` as one tuple per group: a flat list is a single group."""
    if not block_ids:
        return ((),)
    if isinstance(block_ids[0], int):
        return (tuple(block_ids),)  # type: ignore[arg-type]  # a flat list of ints
    return tuple(map(tuple, block_ids))  # type: ignore[arg-type]


def group_lists(block_ids: AnyBlockIds) -> Sequence[Sequence[int]]:
    """``block_ids`` as one list per group, without copying a list of lists."""
    if block_ids and not isinstance(block_ids[0], int):
        return block_ids  # type: ignore[return-value]  # a list per group
    return (block_ids,)  # type: ignore[return-value]  # a flat list: a single group


def num_positions(groups: Sequence[Sequence[int]]) -> int:
    """The longest group's length: how many block positions the request spans."""
    return max(map(len, groups), default=0)


def window(groups: Sequence[Sequence[int]], first: int, end: int, fill: int) -> tuple[int, ...]:
    """Positions ``first .. end - 1`` of every group, one group after another; a position
    past a group's end is ``fill``. Both sides of a transfer cut the same window, so the
    i-th id of one side's window pairs with the i-th of the other's."""
    width = max(end - first, 0)
    out: list[int] = []
    for group in groups:
        part = group[first:end]
        out.extend(part)
        out.extend([fill] * (width - len(part)))
    return tuple(out)


def movable_pairs(
    dest: Sequence[int], source: Sequence[int]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ``(dest, source)`` pairs of two equal windows that move KV.

    A destination that is the null block or missing needs nothing (the consumer keeps no KV
    there); a needed destination whose source is the null block becomes
    :data:`MISSING_BLOCK` (the producer freed it). ValueError when the windows differ in
    length.
    """
    if len(dest) != len(source):
        raise ValueError(f"block windows differ in length: {len(dest)} and {len(source)}")
    if NULL_BLOCK not in dest and MISSING_BLOCK not in dest and NULL_BLOCK not in source:
        return tuple(dest), tuple(source)  # one group, every position real: all pairs move
    kept_dest: list[int] = []
    kept_source: list[int] = []
    for d, s in zip(dest, source, strict=True):
        if d in (NULL_BLOCK, MISSING_BLOCK):
            continue
        kept_dest.append(d)
        kept_source.append(MISSING_BLOCK if s == NULL_BLOCK else s)
    return tuple(kept_dest), tuple(kept_source)


def paired_window(
    dest: Sequence[Sequence[int]],
    source: Sequence[Sequence[int]],
    first: int,
    end: int,
    *,
    nulls: bool = True,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ``(dest, source)`` pairs of positions ``first .. end - 1`` that move KV (a READ:
    the consumer's lists and the producer's); a group one side lacks pairs with nothing.
    ``nulls=False``: the engine's groups keep every position (full attention, MLA), so a
    single group's lists pair as they are without looking for null blocks."""
    if len(dest) == 1 == len(source):  # one group: usually every position pairs as it is
        d, s = dest[0], source[0]
        if first or len(d) != end:  # a whole list is used as it is: one copy, not two
            d = d[first:end]
        if first or len(s) != end:
            s = s[first:end]
        if len(d) == len(s) == end - first and (
            not nulls or (NULL_BLOCK not in d and NULL_BLOCK not in s)
        ):
            return tuple(d), tuple(s)
    if len(dest) != len(source):  # the groups differ in number: nothing pairs
        source = ()
    d_window = window(dest, first, end, NULL_BLOCK)
    s_window = window(source, first, end, MISSING_BLOCK) or (MISSING_BLOCK,) * len(d_window)
    return movable_pairs(d_window, s_window)


def announced_pairs(
    source: BlockGroups, dest: Sequence[int], first: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ``(source, dest)`` pairs a push moves into a consumer's announced ``dest``: its
    window of positions ``first ..`` of every group, one group after another (WRITE mode).

    ValueError names the mismatch when ``dest`` is not a window of ``source``'s groups or
    needs a block the producer does not hold.
    """
    groups = len(source)
    if not groups or len(dest) % groups:
        raise ValueError(
            f"consumer announced {len(dest)} blocks: not a window of the producer's "
            f"{groups} KV-cache group(s)"
        )
    width = len(dest) // groups
    kept_dest, kept_source = movable_pairs(
        dest, window(source, first, first + width, MISSING_BLOCK)
    )
    if MISSING_BLOCK in kept_source:
        raise ValueError(
            f"consumer announced {width} blocks per group from index {first}; the producer "
            f"holds {[len(group) for group in source]} (freed or missing where it needs KV)"
        )
    return kept_source, kept_dest


def group_sizes(
    dest: Sequence[Sequence[int]], source: Sequence[Sequence[int]], first: int, end: int
) -> tuple[int, ...]:
    """How many of :func:`paired_window`'s pairs each group contributes, in group order
    (empty for a single group: all of them). Pages of different groups shard differently
    between TP sizes (KV heads, a recurrent state), so a sliced transfer plans them apart."""
    if len(dest) <= 1:
        return ()
    groups = len(dest)
    if len(source) != groups:
        source = [()] * groups
    return tuple(
        len(
            movable_pairs(
                window([d], first, end, NULL_BLOCK), window([s], first, end, MISSING_BLOCK)
            )[0]
        )
        for d, s in zip(dest, source, strict=True)
    )


def announced_group_sizes(groups: int, dest: Sequence[int]) -> tuple[int, ...]:
    """How many of :func:`announced_pairs`' pairs each of ``groups`` groups contributes
    (empty for a single group)."""
    if groups <= 1:
        return ()
    width = len(dest) // groups
    return tuple(
        sum(1 for d in dest[g * width : (g + 1) * width] if d not in (NULL_BLOCK, MISSING_BLOCK))
        for g in range(groups)
    )
