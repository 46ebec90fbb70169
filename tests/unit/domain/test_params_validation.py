"""Hostile ``kv_transfer_params``: every one is a TransferParamsError naming the key."""

from __future__ import annotations

import time
from typing import Any

import pytest

from moriio.domain.params.transfer_params import TransferParamsError, parse_transfer_params
from moriio.domain.values import hosts
from moriio.domain.values.hosts import InvalidHostError, canonical_host, check_port


def consumer_params(**overrides: Any) -> dict[str, Any]:
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "transfer_id": "tx-1",
        "remote_block_ids": [[1, 2, 3]],
        "remote_host": "127.0.0.1",
        "remote_handshake_port": 6301,
        "remote_notify_port": 61005,
        "remote_tp_size": 2,
        "remote_dp_size": 1,
        "remote_dp_rank": 0,
        "remote_engine_id": "127.0.0.1:6301",
    }
    params.update(overrides)
    return params


def test_valid_params_parse() -> None:
    parsed = parse_transfer_params(consumer_params(remote_host="Prefill-0.Example"), "r")
    assert parsed is not None
    assert parsed.peer is not None
    assert parsed.peer.host == "prefill-0.example"
    assert parsed.remote_block_ids == ((1, 2, 3),)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"remote_engine_id": {}}, "remote_engine_id"),
        ({"remote_engine_id": [1]}, "remote_engine_id"),
        ({"remote_engine_id": 7}, "remote_engine_id"),
        ({"remote_engine_id": "e" * 1000}, "remote_engine_id"),
        ({"remote_dp_rank": 10**6, "remote_dp_size": 10**6}, "remote_dp_size"),
        ({"remote_dp_rank": 3, "remote_dp_size": 2}, "remote_dp_rank"),
        ({"remote_dp_rank": 999, "remote_dp_size": 1000, "remote_tp_size": 8}, "exceeds port"),
        ({"remote_tp_size": 10**9}, "remote_tp_size"),
        ({"remote_tp_size": -1}, "remote_tp_size"),
        ({"remote_tp_size": True}, "remote_tp_size"),
        ({"remote_host": "127.0.0.1 "}, "remote_host"),
        ({"remote_host": "127.0.0.1\n"}, "remote_host"),
        ({"remote_host": "bad host"}, "remote_host"),
        ({"remote_host": ["127.0.0.1"]}, "remote_host"),
        ({"remote_host": "-x.example"}, "remote_host"),
        ({"remote_handshake_port": "\uff16\uff13\uff10\uff11"}, "remote_handshake_port"),
        ({"remote_notify_port": 70000}, "remote_notify_port"),
        ({"remote_notify_port": 1.5}, "remote_notify_port"),
        ({"remote_block_ids": [[True, 2]]}, "remote_block_ids"),
        ({"remote_block_ids": [[1.0, 2]]}, "remote_block_ids"),
        ({"remote_block_ids": [["1"]]}, "remote_block_ids"),
        ({"remote_block_ids": [[-1]]}, "remote_block_ids"),
        ({"remote_block_ids": [[7, 0, False]]}, "remote_block_ids"),
        ({"remote_block_ids": [[None]]}, "remote_block_ids"),
        ({"remote_block_ids": [[2**64]]}, "remote_block_ids"),
        ({"remote_block_ids": [[3, [4]]]}, "remote_block_ids"),
        ({"lease_expires_at": float("inf")}, "lease_expires_at"),
        ({"lease_expires_at": float("nan")}, "lease_expires_at"),
        ({"lease_expires_at": -1.0}, "lease_expires_at"),
        ({"lease_expires_at": 0}, "lease_expires_at"),
        ({"lease_expires_at": 1e15}, "lease_expires_at"),
        ({"lease_expires_at": True}, "lease_expires_at"),
        ({"transfer_id": "t" * 100_000}, "transfer_id"),
        ({"transfer_id": 5}, "transfer_id"),
        ({"remote_instance_id": {}}, "remote_instance_id"),
    ],
)
def test_hostile_params_name_the_key(overrides: dict[str, Any], key: str) -> None:
    with pytest.raises(TransferParamsError, match=key):
        parse_transfer_params(consumer_params(**overrides), f"req-{time.monotonic_ns()}")


@pytest.mark.parametrize("ids", [[0, 1], [1], [0], [5, 2**64 - 1], list(range(200))])
def test_block_ids_that_equal_a_bool_are_still_block_ids(ids: list[int]) -> None:
    parsed = parse_transfer_params(consumer_params(remote_block_ids=[ids]), "r-ints")
    assert parsed is not None
    assert parsed.remote_block_ids == (tuple(ids),)


@pytest.mark.parametrize(
    "ids",
    [
        [2**40, True, 2**41],
        [2**30, 5, False],
        (7, 2**50, True),
        [True] * 3,
        [2**63, 2**62, 0, False],
    ],
)
def test_a_bool_among_block_ids_is_refused_wherever_it_hides(ids: Any) -> None:
    with pytest.raises(TransferParamsError, match="remote_block_ids"):
        parse_transfer_params(consumer_params(remote_block_ids=[ids]), "r-bools")


@pytest.mark.parametrize("ids", [[256, 2**56], [2**24, 65536 * 7], [255, 2**20, 3], (2, 2**8)])
def test_block_ids_whose_bytes_hold_zero_runs_are_block_ids(ids: Any) -> None:
    """Seven zero bytes in a row without a 0 or a 1 among the values: still valid ids."""
    parsed = parse_transfer_params(consumer_params(remote_block_ids=[ids]), "r-zero-runs")
    assert parsed is not None
    assert parsed.remote_block_ids == (tuple(ids),)


def test_the_peer_cache_tells_values_apart_by_type_and_presence() -> None:
    """Equal values of other types, and a null remote_tp_size next to an absent one (only
    an absent one falls back to ``tp_size``), never share a cached peer."""
    base = consumer_params(tp_size=4)
    del base["remote_tp_size"]
    for _ in range(2):
        absent = parse_transfer_params(base, "r-absent")
        null = parse_transfer_params({**base, "remote_tp_size": None}, "r-null")
        assert absent is not None
        assert null is not None
        assert (absent.peer and absent.peer.tp_size, null.peer and null.peer.tp_size) == (4, 0)
        assert parse_transfer_params(consumer_params(remote_dp_size=1), "r-int") is not None
        with pytest.raises(TransferParamsError, match="remote_dp_size"):
            parse_transfer_params(consumer_params(remote_dp_size=True), "r-bool")
        hosts_list = consumer_params(remote_hosts=["10.0.0.1"], remote_dp_size_local=1)
        from_list = parse_transfer_params(hosts_list, "r-list")
        assert from_list is not None
        assert from_list.peer is not None
        assert from_list.peer.host == "10.0.0.1"


def test_huge_tp_size_fails_fast_without_building_addresses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused by its bound before any per-rank work: no port offset is ever computed (a
    count of calls, not a wall-clock bound a loaded machine could break)."""
    from moriio.domain.params import transfer_params

    calls: list[object] = []
    real = transfer_params.port_offset
    monkeypatch.setattr(transfer_params, "port_offset", lambda *a: calls.append(a) or real(*a))
    with pytest.raises(TransferParamsError, match="remote_tp_size"):
        parse_transfer_params(consumer_params(remote_tp_size=10**9), "r-huge")
    assert calls == []
    parse_transfer_params(consumer_params(remote_tp_size=8), "r-fine")
    assert calls  # the control: a valid size does reach the per-rank work


def test_unhashable_values_are_rejected_twice_the_same_way() -> None:
    """The peer cache must neither crash on nor remember an unhashable key."""
    for _ in range(2):
        with pytest.raises(TransferParamsError, match="remote_engine_id"):
            parse_transfer_params(consumer_params(remote_engine_id={"a": 1}), "r-unhashable")


def test_params_that_are_not_a_mapping_are_rejected() -> None:
    with pytest.raises(TransferParamsError, match="mapping"):
        parse_transfer_params(["do_remote_prefill"], "r")  # type: ignore[arg-type]


def test_embedded_router_address_is_validated_too() -> None:
    rid = "___prefill_addr_host:127.0.\x010.1,handshake:6301,notify:61005___decode_addr_" + (
        "host:127.0.0.1,handshake:7301,notify:7105_" + "a" * 32
    )
    params = {"do_remote_prefill": True, "transfer_id": "t", "remote_block_ids": [[1]]}
    with pytest.raises(TransferParamsError, match="remote_host"):
        parse_transfer_params(params, rid)


@pytest.mark.parametrize(
    ("host", "canonical"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("LOCALHOST", "localhost"),
        ("node-1.cluster.local.", "node-1.cluster.local"),
        ("0:0:0:0:0:0:0:1", "::1"),
    ],
)
def test_canonical_host(host: str, canonical: str) -> None:
    assert canonical_host(host) == canonical
    assert canonical_host(host) == canonical  # answered from the table the second time


def test_known_hosts_table_keeps_only_valid_spellings_and_stays_bounded() -> None:
    for _ in range(2):
        with pytest.raises(InvalidHostError):
            canonical_host("1.2.3.999")
    assert "1.2.3.999" not in hosts._known
    for n in range(hosts._KNOWN_LIMIT + 10):
        assert canonical_host(f"10.0.{n // 256}.{n % 256}") == f"10.0.{n // 256}.{n % 256}"
    assert len(hosts._known) <= hosts._KNOWN_LIMIT


@pytest.mark.parametrize(
    "host", ["", " a", "a ", "a\nb", "a\x00", "[::1]", "1.2.3.999", "é.example", "a_b", 5, None]
)
def test_canonical_host_rejects(host: object) -> None:
    with pytest.raises(InvalidHostError):
        canonical_host(host)


@pytest.mark.parametrize("port", [0, 65536, True, "80", 1.0])
def test_check_port_rejects(port: object) -> None:
    with pytest.raises(InvalidHostError):
        check_port(port)


def test_a_plausible_lease_is_kept() -> None:
    params = parse_transfer_params(consumer_params(lease_expires_at=1.7e9), "r-lease")
    assert params.lease_expires_at == 1.7e9
