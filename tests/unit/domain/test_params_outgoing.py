"""The kv_transfer_params moriio writes: exact keys, and what the parser reads back."""

from __future__ import annotations

from moriio.domain.params.outgoing_params import (
    ReturnedParams,
    decode_leg_params,
    prefill_leg_params,
)
from moriio.domain.params.transfer_params import PeerEndpoint, parse_transfer_params
from moriio.domain.values.addresses import ControlAddress
from moriio.domain.values.capability import new_token

RETURNED = ReturnedParams(
    engine_id="10.0.0.1:6301",
    host="10.0.0.1",
    handshake_port=6301,
    notify_port=61005,
    tp_size=2,
    dp_size=4,
    dp_rank=3,
    dp_size_local=2,
    instance_id="p-1",
)


def test_a_producer_returns_the_router_contract_key_for_key() -> None:
    assert RETURNED.for_transfer("t-1", [4, 5], 1000.0) == {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "10.0.0.1:6301",
        "remote_host": "10.0.0.1",
        "remote_handshake_port": 6301,
        "remote_notify_port": 61005,
        "remote_dp_size": 4,
        "remote_dp_rank": 3,
        "remote_dp_rank_override": True,
        "remote_dp_size_local": 2,
        "tp_size": 2,
        "remote_tp_size": 2,
        "remote_instance_id": "p-1",
        "transfer_id": "t-1",
        "remote_block_ids": [[4, 5]],
        "lease_expires_at": 1000.0,
    }


def test_the_returned_params_parse_back_with_their_token() -> None:
    token = new_token()
    returned = RETURNED.for_transfer("t-2", [7], 2000.0, token)
    assert returned["remote_engine_id"] == f"10.0.0.1:6301#{token}"
    params = parse_transfer_params(returned, "d-1")
    assert params is not None
    assert (params.transfer_id, params.token, params.lease_expires_at) == ("t-2", token, 2000.0)
    assert params.peer == PeerEndpoint("10.0.0.1", 6301, 61005, 2, 4, 3, "10.0.0.1:6301", "p-1")
    assert RETURNED.for_transfer("t-3", [1], 1.0)["remote_engine_id"] == "10.0.0.1:6301"


def test_a_routers_legs_name_each_other() -> None:
    decode, prefill = ControlAddress("10.0.0.2", 7301, 7005), ControlAddress("10.0.0.1", 1, 2)
    to_prefill = prefill_leg_params("t", decode, dp_size=2, dp_rank=1, tp_size=1)
    parsed = parse_transfer_params(to_prefill, "p")
    assert parsed is not None
    assert parsed.do_remote_decode
    assert parsed.peer == PeerEndpoint("10.0.0.2", 7301, 7005, 1, 2, 1)
    returned = {"remote_host": "10.0.0.9", "remote_dp_rank": 0, "remote_block_ids": [[3]]}
    to_decode = decode_leg_params("t", returned, prefill, dp_size=2, dp_rank=1, tp_size=1)
    assert to_decode["remote_host"] == "10.0.0.9"  # what the prefill returned wins
    assert to_decode["remote_dp_rank"] == 0
    assert (to_decode["remote_handshake_port"], to_decode["remote_dp_size"]) == (1, 2)
    assert (
        decode_leg_params("t", None, prefill, dp_size=1, dp_rank=0, tp_size=1)["remote_block_ids"]
        is None
    )
