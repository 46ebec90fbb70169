"""What llm-d's routing sidecar sends (``connector_nixlv2.go``, READ and WRITE, serial and
parallel dispatch) parses, and what moriio returns is what llm-d reads back."""

from __future__ import annotations

from typing import Any

import pytest

from moriio.domain.params.transfer_params import TransferParamsError, parse_transfer_params
from moriio.domain.scheduler.producer.book import LocalEndpoint
from moriio.domain.scheduler.producer.by_mode import producer_book
from moriio.domain.timing.policy import TransferPolicy
from moriio.domain.values.modes import TransferMode
from moriio.testing.handoffs import PROMPT

RID = "cmpl-6f1c2a8e-4b7d-11ef-9a1b-0242ac120002-0-1a2b3c4d"  # a vLLM id from x-request-id
UUID = "6f1c2a8e-4b7d-11ef-9a1b-0242ac120002"

# Plain nixlv2 prefill leg: READ, no transfer id, no addresses.
NIXLV2_PREFILL: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def write_prefill_leg(**extra: Any) -> dict[str, Any]:
    """The MoRIIO WRITE prefill leg (serial and parallel paths build the same one)."""
    params: dict[str, Any] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": "10.1.0.7",
        "remote_port": None,
        "remote_notify_port": 61105,
        "remote_dp_rank": 3,
        "remote_dp_rank_override": True,
        "remote_handshake_port": 6401,
        "transfer_id": "tx" + UUID,
        "tp_size": 1,
        "remote_dp_size": 4,
    }
    params.update(extra)
    return params


def parallel_decode_leg(**extra: Any) -> dict[str, Any]:
    """The decode leg llm-d's parallel dispatch makes up from its configuration."""
    params: dict[str, Any] = {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": "10.2.0.9:6301",
        "remote_block_ids": [],
        "remote_host": "10.2.0.9",
        "remote_port": 6301,
        "remote_notify_port": 61005,
        "remote_dp_rank": 1,
        "remote_dp_rank_override": True,
        "remote_handshake_port": 6301,
        "transfer_id": "tx" + UUID,
        "tp_size": 2,
        "remote_dp_size": 2,
    }
    params.update(extra)
    return params


@pytest.mark.parametrize("write_producer", [False, True])
def test_a_plain_nixlv2_prefill_gets_a_transfer_id_named_after_its_request(
    write_producer: bool,
) -> None:
    parsed = parse_transfer_params(NIXLV2_PREFILL, RID, producer_peer=write_producer)
    assert parsed is not None
    assert parsed.do_remote_decode
    assert parsed.transfer_id == f"sidecar-{RID}"
    assert parsed.peer is None


def test_the_prefills_returned_params_carry_what_llm_d_reads_back() -> None:
    """READ: llm-d hands the prefill's answer to the decode unchanged."""
    endpoint = LocalEndpoint("10.2.0.9:6301", "10.2.0.9", 6301, 61005, 2, 4, 3, "p#0", 2)
    book = producer_book(TransferMode.READ, endpoint, TransferPolicy(clock_skew_allowance=0.0))
    params = parse_transfer_params(NIXLV2_PREFILL, RID, producer_peer=False)
    assert params is not None
    assert book.on_allocated(RID, params)
    decision = book.on_finished(
        RID,
        length_capped=True,
        block_ids=[4, 5],
        wall_now=1e9,
        now=0.0,
        params=params,
        prompt=PROMPT,
    )
    returned = decision.params
    assert returned is not None
    assert returned["transfer_id"] == f"sidecar-{RID}"
    assert returned["remote_dp_rank"] == 3  # the global rank the prefill ran on
    assert returned["remote_dp_rank_override"] is True
    assert returned["remote_dp_size"] == 4
    assert returned["remote_dp_size_local"] == 2
    assert returned["tp_size"] == 2
    decode = parse_transfer_params(returned, "cmpl-another-request-0-9f8e7d6c")
    assert decode is not None
    assert decode.transfer_id == f"sidecar-{RID}"
    assert decode.remote_block_ids == ((4, 5),)
    assert decode.peer is not None
    assert (decode.peer.host, decode.peer.dp_rank) == ("10.2.0.9", 3)


def test_a_write_prefill_leg_without_pods_pushes_to_the_decode_pod_it_names() -> None:
    parsed = parse_transfer_params(write_prefill_leg(), RID, consumer=False)
    assert parsed is not None
    assert parsed.transfer_id == "tx" + UUID
    assert parsed.peer is not None
    assert parsed.peer.host == "10.1.0.7"
    assert (parsed.peer.dp_rank, parsed.peer.dp_size, parsed.peer.tp_size) == (3, 4, 1)


@pytest.mark.parametrize(("rank", "host"), [(0, "10.1.0.7"), (1, "10.1.0.7"), (3, "10.1.0.8")])
def test_a_dp_rank_on_another_pod_is_reached_at_that_pods_host(rank: int, host: str) -> None:
    params = write_prefill_leg(
        remote_dp_rank=rank, remote_hosts=["10.1.0.7", "10.1.0.8"], remote_dp_size_local=2
    )
    parsed = parse_transfer_params(params, RID, consumer=False)
    assert parsed is not None
    assert parsed.peer is not None
    assert parsed.peer.host == host
    assert parsed.peer.dp_rank == rank  # ports are offset by the global rank on every pod


def test_a_parallel_decode_leg_parses_with_an_empty_block_list() -> None:
    params = parallel_decode_leg(remote_hosts=["Prefill-0.ns.svc", "10.2.0.10"])
    params["remote_dp_size_local"] = 1
    parsed = parse_transfer_params(params, RID)
    assert parsed is not None
    assert parsed.remote_block_ids == ((),)
    assert parsed.token is None
    assert parsed.peer is not None
    assert (parsed.peer.host, parsed.peer.dp_rank, parsed.peer.tp_size) == ("10.2.0.10", 1, 2)
    assert parsed.peer.engine_id == "10.2.0.9:6301"


def test_a_rank_over_vllm_routers_intra_node_dp_size_is_accepted() -> None:
    """vllm-router overwrites ``remote_dp_size`` with its own intra-node size (1)."""
    params = parallel_decode_leg(remote_dp_rank=3, remote_dp_size=1)
    parsed = parse_transfer_params(params, RID)
    assert parsed is not None
    assert parsed.peer is not None
    assert parsed.peer.dp_rank == 3


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"remote_hosts": "10.1.0.7"}, "remote_hosts"),
        ({"remote_hosts": {"10.1.0.7": 1}}, "remote_hosts"),
        ({"remote_hosts": ["10.1.0.7", 5]}, "remote_hosts"),
        ({"remote_hosts": ["10.1.0.7 "]}, "remote_hosts"),
        ({"remote_hosts": ["bad host"]}, "remote_hosts"),
        ({"remote_hosts": ["10.1.0.7"] * 1025}, "remote_hosts"),
        ({"remote_hosts": [["10.1.0.7"]]}, "remote_hosts"),
        ({"remote_dp_size_local": -1}, "remote_dp_size_local"),
        ({"remote_dp_size_local": 10**9}, "remote_dp_size_local"),
        ({"remote_dp_size_local": True}, "remote_dp_size_local"),
        ({"remote_dp_size_local": "2"}, "remote_dp_size_local"),
        ({"remote_dp_size_local": 2.0}, "remote_dp_size_local"),
        ({"remote_dp_rank_override": "true"}, "remote_dp_rank_override"),
        ({"remote_dp_rank_override": 1}, "remote_dp_rank_override"),
        ({"remote_dp_rank": -1}, "remote_dp_rank"),
        ({"remote_dp_rank": 10**12}, "remote_dp_rank"),
        ({"remote_dp_rank": "3"}, "remote_dp_rank"),
        ({"tp_size": -1}, "remote_tp_size"),
        ({"tp_size": True}, "remote_tp_size"),
        ({"tp_size": 10**9}, "remote_tp_size"),
        ({"remote_dp_size": 0}, "remote_dp_size"),
        ({"remote_dp_rank": 4, "remote_dp_size": 4}, "remote_dp_rank"),
        # A rank whose pod is not listed: forged, or the pod list and the rank disagree.
        ({"remote_hosts": ["10.1.0.7"], "remote_dp_size_local": 2}, "remote_hosts lists 1"),
        ({"remote_hosts": ["10.1.0.7"], "remote_dp_size_local": 1}, "remote_hosts lists 1"),
    ],
)
def test_hostile_llm_d_fields_name_the_key(overrides: dict[str, Any], key: str) -> None:
    placed = {"remote_dp_rank": 3, "remote_dp_size": 4, **overrides}
    for params, consumer in (
        (write_prefill_leg(**placed), False),
        (parallel_decode_leg(**placed), True),
    ):
        with pytest.raises(TransferParamsError, match=key):
            parse_transfer_params(params, RID, consumer=consumer)


def test_an_unlisted_pod_list_changes_nothing_without_a_local_size() -> None:
    """``remote_hosts`` alone cannot place a rank: the single host is used (as in vLLM)."""
    parsed = parse_transfer_params(
        write_prefill_leg(remote_hosts=["10.9.9.9"]), RID, consumer=False
    )
    assert parsed is not None
    assert parsed.peer is not None
    assert parsed.peer.host == "10.1.0.7"


def test_a_consumer_without_a_transfer_id_is_still_refused() -> None:
    params = parallel_decode_leg()
    del params["transfer_id"]
    with pytest.raises(TransferParamsError, match="transfer_id"):
        parse_transfer_params(params, RID)
