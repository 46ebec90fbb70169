"""How tensor parallelism shards a layer's KV heads (and a recurrent state) over ranks, and
which share of them a producer rank hands a consumer rank.

vLLM shards every per-head tensor by contiguous ranges: with ``tp <= total`` rank ``r`` holds
units ``[r * n, (r + 1) * n)``, ``n = total // tp`` (``total % tp`` must be 0); with more
ranks than units (KV heads only: vLLM replicates them) rank ``r`` holds the single unit
``r * total // tp`` (``tp % total`` must be 0). A unit is a KV head, or a head (or channel)
of a Mamba / linear-attention state's sub-projection.

A consumer rank takes KV from a group of producer ranks (:func:`producer_group`), a producer
rank gives KV to a group of consumer ranks (:func:`consumer_group`); where several producer
ranks of a group hold the same unit (replicated heads), only the first one moves it
(:func:`moved_units`), so every unit a consumer rank holds arrives exactly once.
"""

from __future__ import annotations

from moriio.domain.kv.tp import producer_ranks_to_release


class UnevenShardsError(ValueError):
    """Units that do not split evenly over a TP size (vLLM would not shard them so)."""


def check_shards(total: int, tp: int, what: str = "units") -> None:
    """Raise :class:`UnevenShardsError` unless ``total`` units shard evenly over ``tp``."""
    if total < 1 or tp < 1:
        raise UnevenShardsError(f"{what}: need positive counts, got {total} over TP {tp}")
    if (tp <= total and total % tp) or (tp > total and tp % total):
        raise UnevenShardsError(f"{total} {what} do not split evenly over TP {tp}")


def rank_units(rank: int, tp: int, total: int) -> range:
    """The units (global indices) rank ``rank`` of ``tp`` holds, as vLLM shards them."""
    check_shards(total, tp)
    if not 0 <= rank < tp:
        raise ValueError(f"rank must be in [0, {tp}), got {rank}")
    if tp <= total:
        n = total // tp
        return range(rank * n, (rank + 1) * n)
    first = rank * total // tp
    return range(first, first + 1)


def producer_group(consumer_rank: int, consumer_tp: int, producer_tp: int) -> range:
    """The producer ranks consumer rank ``consumer_rank`` takes KV from (and releases)."""
    return producer_ranks_to_release(consumer_rank, consumer_tp, producer_tp)


def consumer_group(producer_rank: int, producer_tp: int, consumer_tp: int) -> range:
    """The consumer ranks producer rank ``producer_rank`` gives KV to."""
    if consumer_tp <= producer_tp:
        first = producer_rank * consumer_tp // producer_tp
        producer_group(first, consumer_tp, producer_tp)  # validates the sizes
        return range(first, first + 1)
    ratio = consumer_tp // producer_tp
    producer_group(producer_rank * ratio, consumer_tp, producer_tp)
    return range(producer_rank * ratio, (producer_rank + 1) * ratio)


def moved_units(
    total: int, producer_rank: int, producer_tp: int, consumer_rank: int, consumer_tp: int
) -> range:
    """The units producer rank ``producer_rank`` moves to consumer rank ``consumer_rank``:
    those both hold, unless an earlier producer rank of the consumer's group holds them too
    (replicated heads move once). Empty when the pair moves nothing."""
    wanted = rank_units(consumer_rank, consumer_tp, total)
    held = rank_units(producer_rank, producer_tp, total)
    group = producer_group(consumer_rank, consumer_tp, producer_tp)
    if producer_rank not in group:
        return range(0)
    start, stop = max(wanted.start, held.start), min(wanted.stop, held.stop)
    for earlier in range(group.start, producer_rank):
        other = rank_units(earlier, producer_tp, total)
        if other.start <= start and stop <= other.stop:
            return range(0)  # (ranges of one TP size are nested or disjoint)
    return range(start, max(start, stop))


def ranks_covered(consumer_rank: int, consumer_tp: int, producer_tp: int) -> tuple[int, ...]:
    """Producer ranks consumer rank ``consumer_rank`` tells to release a transfer that cannot
    run at all (TP sizes that do not pair): rank ``p`` by consumer rank ``p % consumer_tp``,
    so every producer rank is told exactly once, whatever the sizes."""
    return tuple(range(consumer_rank, producer_tp, consumer_tp))
