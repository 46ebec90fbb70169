import pytest

from moriio.domain.kv.tp import (
    ReplicatedKVHeadsRequiredError,
    check_kv_head_replication,
    expected_ack_count,
    producer_ranks_to_release,
    remote_tp_rank,
)


def test_remote_tp_rank_same_tp_maps_to_self() -> None:
    assert [remote_tp_rank(r, 4, 4) for r in range(4)] == [0, 1, 2, 3]


def test_remote_tp_rank_p4_d8_floor_maps_decode_to_prefill() -> None:
    assert [remote_tp_rank(r, 8, 4) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_remote_tp_rank_p8_d4_maps_to_first_prefill_rank_per_pair() -> None:
    assert [remote_tp_rank(r, 4, 8) for r in range(4)] == [0, 2, 4, 6]


@pytest.mark.parametrize(("local", "remote"), [(6, 4), (4, 6)])
def test_remote_tp_rank_invalid_non_multiple_tp_raises(local: int, remote: int) -> None:
    with pytest.raises(ValueError, match="multiple"):
        remote_tp_rank(0, local, remote)


@pytest.mark.parametrize(
    ("rank", "local", "remote"), [(4, 4, 4), (-1, 4, 4), (0, 0, 4), (0, 4, 0), (True, 4, 4)]
)
def test_remote_tp_rank_rejects_bad_ranks_and_sizes(rank: int, local: int, remote: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        remote_tp_rank(rank, local, remote)


@pytest.mark.parametrize(("local", "remote", "heads"), [(4, 4, 8), (8, 4, 4), (4, 8, 4)])
def test_heterogeneous_tp_head_guard_allows_supported_layouts(
    local: int, remote: int, heads: int
) -> None:
    check_kv_head_replication(local, remote, heads, is_mla=False)


@pytest.mark.parametrize(("local", "remote"), [(4, 2), (2, 4), (8, 1)])
def test_heterogeneous_tp_head_guard_allows_mla_layouts(local: int, remote: int) -> None:
    check_kv_head_replication(local, remote, 1, is_mla=True)


@pytest.mark.parametrize(("local", "remote", "heads"), [(4, 2, 4), (2, 4, 4)])
def test_heterogeneous_tp_head_guard_rejects_split_kv_heads(
    local: int, remote: int, heads: int
) -> None:
    with pytest.raises(NotImplementedError, match="replicated KV heads"):
        check_kv_head_replication(local, remote, heads, is_mla=False)
    with pytest.raises(ReplicatedKVHeadsRequiredError):
        check_kv_head_replication(local, remote, heads, is_mla=False)


def test_head_guard_rejects_non_multiple_tp_even_for_mla() -> None:
    with pytest.raises(ValueError, match="multiple"):
        check_kv_head_replication(6, 4, 1, is_mla=True)


@pytest.mark.parametrize(("producer", "consumer"), [(4, 4), (8, 4), (8, 1)])
def test_expected_ack_count_for_homogeneous_or_smaller_consumer_tp_is_one(
    producer: int, consumer: int
) -> None:
    assert expected_ack_count(producer, consumer) == 1


def test_expected_ack_count_for_decode_fan_in() -> None:
    assert expected_ack_count(4, 8) == 2
    assert expected_ack_count(1, 8) == 8


@pytest.mark.parametrize(("producer", "consumer"), [(4, 6), (6, 4), (0, 4), (4, 0)])
def test_expected_ack_count_rejects_non_multiple_fan_in(producer: int, consumer: int) -> None:
    with pytest.raises(ValueError, match=r"multiple|positive"):
        expected_ack_count(producer, consumer)


@pytest.mark.parametrize(("producer", "consumer"), [(1, 1), (4, 4), (4, 8), (8, 4), (1, 8), (8, 1)])
def test_release_targets_cover_every_producer_rank_with_the_expected_fan_in(
    producer: int, consumer: int
) -> None:
    releases = [0] * producer
    for rank in range(consumer):
        targets = producer_ranks_to_release(rank, consumer, producer)
        assert remote_tp_rank(rank, consumer, producer) in targets  # the rank it reads from
        for p in targets:
            releases[p] += 1
    assert releases == [expected_ack_count(producer, consumer)] * producer


def test_release_targets_for_smaller_consumer_include_unread_replicas() -> None:
    assert list(producer_ranks_to_release(1, 4, 8)) == [2, 3]
