"""Heterogeneous tensor parallelism between producer (prefill) and consumer (decode).

TP sizes on the two sides must be multiples of each other. A rank on the larger side maps to
one rank on the smaller side; when the consumer is larger, each producer rank is released by
``consumer_tp // producer_tp`` consumer ranks (ACK fan-in).
"""

from __future__ import annotations


class ReplicatedKVHeadsRequiredError(NotImplementedError):
    """Different TP sizes would split KV heads across ranks; only replicated heads are moved."""


def _check_size(name: str, size: int) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{name} must be a positive int, got {size!r}")


def _check_rank(name: str, rank: int, size: int) -> None:
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"{name} must be an int in [0, {size}), got {rank!r}")


def _ratio(larger: int, smaller: int, what: str) -> int:
    if larger % smaller:
        raise ValueError(
            f"{what}: TP sizes {larger} and {smaller} must be a multiple of each other"
        )
    return larger // smaller


def remote_tp_rank(local_rank: int, local_size: int, remote_size: int) -> int:
    """The remote TP rank that local rank ``local_rank`` transfers with.

    Equal sizes map a rank to itself; a larger remote maps local rank r to r * (remote/local)
    (the first of its group); a larger local side maps r to r // (local/remote).
    """
    _check_size("local_size", local_size)
    _check_size("remote_size", remote_size)
    _check_rank("local_rank", local_rank, local_size)
    if remote_size == local_size:
        return local_rank
    if remote_size > local_size:
        return local_rank * _ratio(remote_size, local_size, "remote_tp_rank")
    return local_rank // _ratio(local_size, remote_size, "remote_tp_rank")


def expected_ack_count(producer_tp: int, consumer_tp: int) -> int:
    """ACKs that release one producer rank: 1 unless the consumer TP is larger."""
    _check_size("producer_tp", producer_tp)
    _check_size("consumer_tp", consumer_tp)
    if consumer_tp <= producer_tp:
        _ratio(producer_tp, consumer_tp, "expected_ack_count")
        return 1
    return _ratio(consumer_tp, producer_tp, "expected_ack_count")


def release_acks(producer_tp: int, consumer_tp: int) -> int:
    """ACKs that release one producer rank from consumers of TP ``consumer_tp``: as
    :func:`expected_ack_count`, but 1 for sizes that do not pair (such a consumer fails its
    loads and tells each producer rank once, see :func:`moriio.domain.kv.shards.ranks_covered`).
    """
    _check_size("producer_tp", producer_tp)
    _check_size("consumer_tp", consumer_tp)
    if max(producer_tp, consumer_tp) % min(producer_tp, consumer_tp):
        return 1
    return expected_ack_count(producer_tp, consumer_tp)


def producer_ranks_to_release(consumer_rank: int, consumer_tp: int, producer_tp: int) -> range:
    """Producer ranks a consumer rank must send ``release`` to.

    Every producer rank is covered: with a larger consumer, exactly
    :func:`expected_ack_count` consumer ranks release each producer rank; with a larger
    producer, each consumer rank releases its whole group of producer ranks (including those
    it did not read from, which hold the same replicated blocks).
    """
    _check_size("consumer_tp", consumer_tp)
    _check_size("producer_tp", producer_tp)
    _check_rank("consumer_rank", consumer_rank, consumer_tp)
    if producer_tp > consumer_tp:
        group = _ratio(producer_tp, consumer_tp, "producer_ranks_to_release")
        return range(consumer_rank * group, (consumer_rank + 1) * group)
    first = remote_tp_rank(consumer_rank, consumer_tp, producer_tp)
    return range(first, first + 1)


def check_kv_head_replication(
    local_tp: int, remote_tp: int, total_num_kv_heads: int, is_mla: bool
) -> None:
    """Refuse TP pairs whose per-rank KV blocks differ in layout.

    Allowed: MLA (the latent cache is replicated on every rank), equal TP sizes, or both sides
    holding at least one full copy of every KV head per rank (``min(tp) >= total heads``).
    Raises :class:`ReplicatedKVHeadsRequiredError` otherwise, ValueError for bad sizes.
    """
    _check_size("local_tp", local_tp)
    _check_size("remote_tp", remote_tp)
    _check_size("total_num_kv_heads", total_num_kv_heads)
    larger, smaller = max(local_tp, remote_tp), min(local_tp, remote_tp)
    _ratio(larger, smaller, "check_kv_head_replication")
    if is_mla or local_tp == remote_tp or smaller >= total_num_kv_heads:
        return
    raise ReplicatedKVHeadsRequiredError(
        f"TP {local_tp} <-> {remote_tp} with {total_num_kv_heads} KV heads would split heads "
        f"across ranks; heterogeneous TP requires replicated KV heads "
        f"(min TP >= {total_num_kv_heads}) or an MLA model"
    )
